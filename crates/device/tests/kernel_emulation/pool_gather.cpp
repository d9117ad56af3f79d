// Runs pool.cu's 16-bit backward kernels (one thread per input element, gathering) against its
// f32 ones (one thread per output, adding with atomicAdd), on one host thread, over max / avg /
// adaptive-average geometries with strides, padding, dilation, ceil_mode, count_include_pad and
// divisor_override. The 16-bit types are f32 stand-ins here, so both must agree to f32 rounding.
// See README.md.
#include "cuda_host.h"
#include "../../src/ops/pool/pool.cu"
#include <random>
int fails = 0;
void check(const char* what, PoolArgs a, int kind) {
  u64 in = a.planes*a.ih*a.iw, out = a.planes*a.oh*a.ow;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> d(-20, 20);
  std::vector<float> x(in), g(out), y(out), ref(in, 0.f), got_f(in);
  for (auto& v : x) v = d(rng) * 0.25f;  // ties on purpose
  for (auto& v : g) v = d(rng) * 0.5f + 0.1f;
  std::vector<i64> idx(out);
  std::vector<__nv_bfloat16> gb(out), gin(in);
  for (u64 i = 0; i < out; ++i) gb[i].v = g[i];
  if (kind == 0) {
    kiln_max_pool_f32(x.data(), a, y.data(), idx.data(), out);
    kiln_max_pool_backward_f32(g.data(), idx.data(), a, ref.data(), out);
    kiln_max_pool_backward_bf16(gb.data(), idx.data(), a, gin.data(), in);
  } else if (kind == 1) {
    kiln_avg_pool_backward_f32(g.data(), a, ref.data(), out);
    kiln_avg_pool_backward_bf16(gb.data(), a, gin.data(), in);
  } else {
    kiln_adaptive_avg_pool_backward_f32(g.data(), a, ref.data(), out);
    kiln_adaptive_avg_pool_backward_bf16(gb.data(), a, gin.data(), in);
  }
  double worst = 0;
  for (u64 i = 0; i < in; ++i) worst = fmax(worst, fabs(gin[i].v - ref[i]));
  if (worst > 1e-4) { printf("FAIL %s kind %d worst %g\n", what, kind, worst); fails++; }
}
u64 outsz(u64 in, u64 k, u64 s, u64 p, u64 dil, bool ceil) {
  u64 eff = dil*(k-1)+1; i64 num = (i64)in + 2*(i64)p - (i64)eff;
  u64 o = (num + (ceil ? (i64)s-1 : 0)) / s + 1;
  if (ceil && (o-1)*s >= in + p) o--;
  return o;
}
int main() {
  blockDim.x = 1; // one host thread runs every grid-stride iteration
  int n = 0;
  for (u64 ih = 3; ih <= 9; ih += 3) for (u64 iw = 4; iw <= 8; iw += 4)
  for (u64 k = 1; k <= 3; ++k) for (u64 s = 1; s <= 3; ++s) for (u64 p = 0; p <= k/2; ++p)
  for (u64 dil = 1; dil <= 2; ++dil) for (int ceil = 0; ceil < 2; ++ceil) for (int cip = 0; cip < 2; ++cip) {
    if (dil*(k-1)+1 > ih + 2*p || dil*(k-1)+1 > iw + 2*p) continue;
    PoolArgs a{}; a.planes = 2; a.ih = ih; a.iw = iw; a.kh = k; a.kw = k == 1 ? 2 : k - 1; a.sh = s; a.sw = s == 1 ? 2 : s;
    a.ph = p; a.pw = a.kw/2 < p ? a.kw/2 : p; a.dh = dil; a.dw = 1;
    if (dil*(a.kh-1)+1 > ih + 2*a.ph || a.kw > iw + 2*a.pw) continue;
    a.oh = outsz(ih, a.kh, a.sh, a.ph, a.dh, ceil); a.ow = outsz(iw, a.kw, a.sw, a.pw, 1, ceil);
    check("max", a, 0); n++;
    PoolArgs b = a; b.dh = 1; b.dw = 1; b.count_include_pad = cip;
    b.oh = outsz(ih, b.kh, b.sh, b.ph, 1, ceil); b.ow = outsz(iw, b.kw, b.sw, b.pw, 1, ceil);
    check("avg", b, 1); n++;
    b.divisor_override = 3; check("avg_div", b, 1); n++;
  }
  for (u64 ih = 1; ih <= 9; ++ih) for (u64 iw = 1; iw <= 8; ++iw) for (u64 oh = 1; oh <= 10; ++oh) for (u64 ow = 1; ow <= 9; ow += 2) {
    PoolArgs a{}; a.planes = 2; a.ih = ih; a.iw = iw; a.oh = oh; a.ow = ow;
    check("adaptive", a, 2); n++;
  }
  printf("%d cases, %d failures\n", n, fails);
}
