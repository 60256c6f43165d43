#!/bin/sh
# Prints the first Python that imports torch (or the modules of $1, e.g. "torch, numpy") among $MOE_PYTHON,
# $PYTHON (configure's), python3 and /usr/bin/python3 (Debian's python3-torch); exits 1, printing nothing,
# when none does.
for candidate in "$MOE_PYTHON" "$PYTHON" python3 /usr/bin/python3; do
    [ -n "$candidate" ] && [ "$candidate" != : ] || continue
    if "$candidate" -c "import ${1:-torch}" >/dev/null 2>&1; then
        echo "$candidate"
        exit 0
    fi
done
exit 1
