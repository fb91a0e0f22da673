#!/usr/bin/env bash
# Usage errors exit 2 with a message that names the problem; --help and --version exit 0.
# usage: usage_checks.sh WARMCTX [WARMCTX_BENCH]
set -u
bin="$1"
fails=0
expect() {  # expect CODE REGEX -- ARGS...
    local want="$1" re="$2"; shift 3
    local out rc
    out=$("$bin" "$@" 2>&1); rc=$?
    if [[ $rc -ne $want ]] || ! grep -Eq -- "$re" <<<"$out"; then
        echo "FAIL: $(basename "$bin") $* -> rc $rc (want $want), output: $out"; fails=$((fails + 1))
    fi
}
expect 2 "unknown command 'frobnicate' \(commands: .*serve" -- frobnicate
expect 2 "A subcommand is required" --
expect 2 "--port: Value abc not in range" -- serve --port abc
expect 2 "not expected: --bogus" -- serve --bogus
expect 2 "not expected: --bogus" -- verify --bogus
expect 0 "Usage: .* serve" -- serve --help
expect 0 "^warmctx [0-9]" -- --version
# The benchmarks are warmctx-bench's: `warmctx bench` names it, and --help says where they are.
expect 2 "run warmctx-bench trace --json" -- bench trace --json
expect 0 "benchmarks .*warmctx-bench" -- --help
if [[ $# -ge 2 ]]; then
    bin="$2"
    expect 2 "unknown command 'frobnicate' \(commands: engine, .*trace.*soak" -- frobnicate
    expect 2 "A subcommand is required" --
    expect 2 "not expected: --bogus" -- trace --bogus
    expect 0 "Usage: .* soak" -- soak --help
    expect 0 "^warmctx-bench [0-9]" -- --version
fi
[[ $fails -eq 0 ]] && echo "usage checks: all passed"
exit $fails
