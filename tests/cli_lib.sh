# cli_lib.sh - sourced by the command-line tests (test_cli.sh, test_gpt_cli.sh): with $loom, $tmp
# and $fails set, expect_fail "expected text" args... runs `loom args...` and counts a failure
# unless it exits non-zero (no signal) with exactly one stderr line holding the text.
expect_fail() {
    local want="$1"; shift
    "$loom" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    local lines; lines=$(wc -l <"$tmp/err")
    if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
        echo "FAIL: loom $* -> exit $rc, $lines stderr lines: $(cat "$tmp/err")"; fails=$((fails + 1))
    else
        echo "ok   loom ${*:1:4} ... -> $(cat "$tmp/err")"
    fi
}
