#!/usr/bin/env bash
# Run every Fuzz* target in the module for the given time each.
set -euo pipefail
t=${1:-30s}
for pkg in $(go list ./...); do
    dir=$(go list -f '{{.Dir}}' "$pkg")
    for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | awk '{print $2}' | sort -u); do
        echo "== $pkg $f ($t)"
        # Minimizing a large input takes 60 s by default and stalls a short run.
        go test -run '^$' -fuzz "^$f\$" -fuzztime "$t" -fuzzminimizetime 2s "$pkg"
    done
done
