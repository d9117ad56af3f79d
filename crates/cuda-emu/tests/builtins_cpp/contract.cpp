// Compiled by the builtins test with FMA contraction switched on (-ffp-contract=fast and an
// FMA-capable -march): reads (a, b, c) float triples and writes __fadd_rn(__fmul_rn(a, b), c)
// then the plain a * b + c, so the test sees the intrinsics stay unfused where g++ fuses the
// plain expression. Invariant: only the two expressions; no other output.
#include "kiln_emu_builtins.h"

#include <cstdio>

int main() {
    float v[3];
    while (std::fread(v, sizeof(float), 3, stdin) == 3) {
        const float out[2] = {__fadd_rn(__fmul_rn(v[0], v[1]), v[2]), v[0] * v[1] + v[2]};
        std::fwrite(out, sizeof(float), 2, stdout);
    }
    return 0;
}
