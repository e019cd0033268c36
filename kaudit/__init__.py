"""kaudit: audit GPU kernels written by language models before anyone believes their speedups."""

__version__ = "0.1.0"

from kaudit.api import scan_paths, scan_source  # noqa: E402
from kaudit.audit import KernelAudit, audit_kernel  # noqa: E402
from kaudit.config import Config  # noqa: E402
from kaudit.dynamic.options import DynamicOptions  # noqa: E402
from kaudit.findings import Finding, Level, Location, ScanError  # noqa: E402
from kaudit.report.model import KernelOutcome, Report  # noqa: E402

__all__ = ["Config", "DynamicOptions", "Finding", "KernelAudit", "KernelOutcome", "Level", "Location",
           "Report", "ScanError", "__version__", "audit_kernel", "scan_paths", "scan_source"]
