#!/usr/bin/env bash
# The scan step of action.yml, runnable on its own (tests/test_github_action.py runs it locally).
# Inputs come as KAUDIT_* environment variables; results go to $GITHUB_OUTPUT, the Markdown
# summary to $GITHUB_STEP_SUMMARY. It never fails the step itself: the action's Gate step does,
# after the SARIF upload, using the exit code written here.
set -uo pipefail

report_dir="${KAUDIT_REPORT_DIR:-kaudit-report}"
mkdir -p "$report_dir"
rm -f "$report_dir"/kaudit.json "$report_dir"/kaudit.md "$report_dir"/kaudit.txt "$report_dir"/kaudit-*.sarif
read -r -a paths <<< "${KAUDIT_PATHS:-.}"
args=(scan "${paths[@]}" --output-dir "$report_dir" --fail-on "${KAUDIT_FAIL_ON:-error}")
[[ -n "${KAUDIT_BASELINE:-}" ]] && args+=(--baseline "$KAUDIT_BASELINE")
[[ -n "${KAUDIT_BASELINE_TIMINGS:-}" ]] && args+=(--baseline-timings "$KAUDIT_BASELINE_TIMINGS")

kaudit "${args[@]}"
status=$?

sarif=""
[[ -f "$report_dir/kaudit-static.sarif" ]] && sarif="$report_dir/kaudit-static.sarif"
if [[ -n "${GITHUB_OUTPUT:-}" ]]; then
  {
    echo "exit-code=$status"
    echo "report-dir=$report_dir"
    echo "sarif-static=$sarif"
  } >> "$GITHUB_OUTPUT"
fi
if [[ -n "${GITHUB_STEP_SUMMARY:-}" && -f "$report_dir/kaudit.md" ]]; then
  cat "$report_dir/kaudit.md" >> "$GITHUB_STEP_SUMMARY"
fi
exit 0
