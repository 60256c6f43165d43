#!/bin/sh
# libmoe.so exports the public API and nothing else: every defined dynamic symbol is a moe_* name (no C++ symbol
# of gpu/, no helper of ref/ or src/), the few the toolchain puts in every shared object aside, and every
# function declared in include/ is among them.  Skipped (77) where nm is missing or no shared libmoe was built.
# Run from the build folder (make check does); LIBMOE_SO may name another library.
so=${LIBMOE_SO:-.libs/libmoe.so}
srcdir=${srcdir:-.}
command -v nm >/dev/null 2>&1 || { echo "SKIP: no nm"; exit 77; }
[ -e "$so" ] || { echo "SKIP: no $so (a build without shared libraries)"; exit 77; }
names=$(nm -D --defined-only "$so" | awk 'NF >= 3 { sub(/@.*/, "", $3); print $3 }') ||
    { echo "ERROR: nm -D --defined-only $so failed"; exit 99; }
[ -n "$names" ] || { echo "FAIL: $so exports no symbol"; exit 1; }
status=0
others=$(printf '%s\n' "$names" | grep -v '^moe_' | grep -vx -e _init -e _fini -e _edata -e _end -e __bss_start)
if [ -n "$others" ]; then
    echo "FAIL: $so exports $(printf '%s\n' "$others" | wc -l) symbols outside moe_*, among them:"
    printf '%s\n' "$others" | head -20 | sed 's/^/  /'
    status=1
fi
public=$(grep -hoE '^[a-z0-9_ ]*[ *]moe_[a-z0-9_]+\(' "$srcdir"/include/*.h | sed 's/.*\(moe_[a-z0-9_]*\)(/\1/' | sort -u)
[ -n "$public" ] || { echo "ERROR: no function declared in $srcdir/include/*.h"; exit 99; }
for f in $public; do
    printf '%s\n' "$names" | grep -qx "$f" || { echo "FAIL: the public function $f is not exported"; status=1; }
done
[ "$status" = 0 ] && echo "PASS: $(printf '%s\n' "$names" | wc -l) symbols exported, all moe_*;" \
    "the $(printf '%s\n' "$public" | wc -l) functions of include/ among them"
exit $status
