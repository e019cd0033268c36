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
if [[ "${KAUDIT_DYNAMIC:-false}" == "true" ]]; then
  args+=(--dynamic --device "${KAUDIT_DEVICE:-auto}")
  [[ -n "${KAUDIT_TOLERANCE:-}" ]] && args+=(--tolerance "$KAUDIT_TOLERANCE")
  [[ -n "${KAUDIT_PROBLEMS:-}" ]] && args+=(--problems "$KAUDIT_PROBLEMS")
  args+=(--sandbox "${KAUDIT_SANDBOX:-on}")
fi

echo "kaudit ${args[*]}" >&2
kaudit "${args[@]}"
status=$?

# the dynamic run writes its findings to a second SARIF file, one upload category each
sarif_output() {
  local file="$report_dir/kaudit-$1.sarif"
  if [[ -f "$file" ]]; then echo "sarif-$1=$file"; else echo "sarif-$1="; fi
}
if [[ -n "${GITHUB_OUTPUT:-}" ]]; then
  {
    echo "exit-code=$status"
    echo "report-dir=$report_dir"
    sarif_output static
    sarif_output dynamic
  } >> "$GITHUB_OUTPUT"
fi
if [[ -n "${GITHUB_STEP_SUMMARY:-}" && -f "$report_dir/kaudit.md" ]]; then
  cat "$report_dir/kaudit.md" >> "$GITHUB_STEP_SUMMARY"
fi
exit 0
