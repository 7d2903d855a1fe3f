#!/usr/bin/env bash
# Regenerates tests/data/upstream_cases.jsonl: the answers of k8s.io/apimachinery v0.37.2 to the
# curated inputs (curated.py: upstream's test-table inputs and hand-picked edge cases) and to
# random ones (gen.py). Needs Go and the module in the Go module cache (scripts/reference
# fetches it). Test tooling only.
#
# For a bigger differential run that is not kept in the repository:
#   tests/upstream/regen.sh --big SEED COUNT   (then runs the test against that file)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$here/oracle" && GOFLAGS=-mod=mod go build -o "$tmp/oracle" .)
if [[ "${1:-}" == "--big" ]]; then
    python3 "$here/gen.py" "${2:-1}" "${3:-20000}" | "$tmp/oracle" > "$tmp/big.jsonl"
    cd "$here/../.."
    KUMO_APIMACHINERY_CASES="$tmp/big.jsonl" cargo test -p kumo-apimachinery --test upstream_cases
    exit 0
fi
python3 "$here/curated.py" | "$tmp/oracle" > "$tmp/curated.jsonl"
python3 "$here/gen.py" 21 700 | "$tmp/oracle" > "$tmp/random.jsonl"
python3 "$here/pack.py" "$tmp/curated.jsonl" "$tmp/random.jsonl" 3 > "$here/../data/upstream_cases.jsonl"
