"""kaudit: audit GPU kernels written by language models before anyone believes their speedups."""

__version__ = "0.1.0"

from kaudit.api import Report, scan_paths, scan_source  # noqa: E402
from kaudit.config import Config  # noqa: E402
from kaudit.findings import Finding, Level, Location, ScanError  # noqa: E402

__all__ = ["Config", "Finding", "Level", "Location", "Report", "ScanError", "__version__",
           "scan_paths", "scan_source"]
