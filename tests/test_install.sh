#!/usr/bin/env bash
# test_install.sh BUILD_DIR SOURCE_DIR - `cmake --install` puts loom.h, the static and shared
# libraries and loom.pc under a prefix, and a user program builds against them with pkg-config
# alone and runs.
set -eu
build="$1" src="$2"
prefix="${LOOM_TEST_TMP:-/tmp}/install.$$"
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/loom.h lib/libloom.a lib/pkgconfig/loom.pc bin/loom; do
    [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
ls "$prefix"/lib/libloom.so* >/dev/null || { echo "FAIL: shared library not installed"; exit 1; }
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cat >"$prefix/user.c" <<'C'
#include <loom.h>
#include <stdio.h>
int main(void) {
    loom_graph *g = loom_graph_new(NULL);
    double a[2] = {1, 2};
    int64_t n = 2;
    loom_tensor *s = loom_sum_all(g, loom_exp(g, loom_input(g, LOOM_F64, 1, &n, a)));
    loom_output(s);
    int rc = loom_graph_run(g);
    printf("%.6f\n", loom_item(s));
    loom_graph_free(g);
    return rc;
}
C
cc "$prefix/user.c" -o "$prefix/user" $(pkg-config --cflags --libs loom) -Wl,-rpath,"$prefix/lib"
out=$("$prefix/user")
[ "$out" = "10.107338" ] || { echo "FAIL: shared build printed '$out', expected 10.107338"; exit 1; }
cc "$prefix/user.c" -o "$prefix/user_static" $(pkg-config --cflags loom) "$prefix/lib/libloom.a" \
    $(pkg-config --static --libs loom | sed 's/-lloom//')
[ "$("$prefix/user_static")" = "10.107338" ] || { echo "FAIL: static build"; exit 1; }
echo "ok: installed under $prefix, built with pkg-config (shared and static)"
