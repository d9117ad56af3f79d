// Runs norm.cu's kernels (f64 instantiation, one block of 64 threads: two warps) on the host
// against a direct double-precision evaluation of the formulas in its top comment, for batch
// norm ([N, C, S]) and layer norm ([rows, cols]) shapes with and without weight/bias, train and
// eval. See README.md.
#include "cuda_host.h"
#include "../../src/ops/norm/norm.cu"
#include <random>
int fails = 0;
void near(const char* what, double got, double want, double tol = 1e-9) {
  if (fabs(got - want) > tol * (1 + fabs(want))) { if (fails < 20) printf("FAIL %s: %g vs %g\n", what, got, want); fails++; }
}
// input viewed [outer, stats, inner] (layer: outer=1 stats=rows inner=cols ... handled by args)
void batch(u64 N, u64 C, u64 S, bool has_w, bool has_b, bool train) {
  NormArgs a{}; a.n_stats = C; a.count = N*S; a.inner = S; a.outer_stride = C*S; a.total = N*C*S;
  a.stat_div = S; a.stat_mod = C; a.param_div = S; a.param_mod = C; a.has_w = has_w; a.has_b = has_b;
  a.sums_weighted = 0; a.train = train; a.eps = 1e-5;
  std::mt19937 rng(N*100 + C*10 + S); std::uniform_real_distribution<double> d(-2, 3);
  std::vector<double> x(a.total), go(a.total), w(C), b(C), mean(C), var(C), rstd(C), y(a.total), s1(C), s2(C), dx(a.total);
  for (auto& v : x) v = d(rng); for (auto& v : go) v = d(rng); for (auto& v : w) v = d(rng); for (auto& v : b) v = d(rng);
  run([&] { kiln_norm_stats_f64(x.data(), a, mean.data(), var.data(), rstd.data()); });
  run([&] { kiln_norm_apply_f64(x.data(), a, mean.data(), rstd.data(), has_w ? w.data() : nullptr, has_b ? b.data() : nullptr, y.data()); });
  run([&] { kiln_norm_backward_sums_f64(go.data(), x.data(), a, mean.data(), rstd.data(), nullptr, s1.data(), s2.data()); });
  run([&] { kiln_norm_backward_dx_f64(go.data(), x.data(), a, mean.data(), rstd.data(), has_w ? w.data() : nullptr, s1.data(), s2.data(), dx.data()); });
  for (u64 c = 0; c < C; ++c) {
    double m = 0, v = 0, n = N*S;
    for (u64 i = 0; i < N; ++i) for (u64 s = 0; s < S; ++s) m += x[(i*C+c)*S+s];
    m /= n;
    for (u64 i = 0; i < N; ++i) for (u64 s = 0; s < S; ++s) v += pow(x[(i*C+c)*S+s]-m, 2);
    v /= n; double r = 1/sqrt(v + 1e-5);
    near("mean", mean[c], m); near("var", var[c], v); near("rstd", rstd[c], r);
    double sg = 0, sgx = 0;
    for (u64 i = 0; i < N; ++i) for (u64 s = 0; s < S; ++s) { u64 k = (i*C+c)*S+s; double xh = (x[k]-m)*r; sg += go[k]; sgx += go[k]*xh;
      near("y", y[k], xh * (has_w ? w[c] : 1) + (has_b ? b[c] : 0)); }
    near("sum_g", s1[c], sg); near("sum_gx", s2[c], sgx);
    double wc = has_w ? w[c] : 1;
    for (u64 i = 0; i < N; ++i) for (u64 s = 0; s < S; ++s) { u64 k = (i*C+c)*S+s; double xh = (x[k]-m)*r;
      double want = train ? wc * r * (go[k] - sg/n - xh*sgx/n) : go[k]*wc*r; near("dx", dx[k], want); }
  }
}
void layer(u64 R, u64 K, bool has_w, bool has_b) {
  NormArgs a{}; a.n_stats = R; a.count = K; a.inner = K; a.outer_stride = 0; a.total = R*K;
  a.stat_div = K; a.stat_mod = R; a.param_div = 1; a.param_mod = K; a.has_w = has_w; a.has_b = has_b;
  a.sums_weighted = 1; a.train = 1; a.eps = 1e-5;
  std::mt19937 rng(R*100 + K); std::uniform_real_distribution<double> d(-2, 3);
  std::vector<double> x(a.total), go(a.total), w(K), b(K), mean(R), var(R), rstd(R), y(a.total), s1(R), s2(R), dx(a.total), dw(K), db(K);
  for (auto& v : x) v = d(rng); for (auto& v : go) v = d(rng); for (auto& v : w) v = d(rng); for (auto& v : b) v = d(rng);
  const double* wp = has_w ? w.data() : nullptr;
  run([&] { kiln_norm_stats_f64(x.data(), a, mean.data(), var.data(), rstd.data()); });
  run([&] { kiln_norm_apply_f64(x.data(), a, mean.data(), rstd.data(), wp, has_b ? b.data() : nullptr, y.data()); });
  run([&] { kiln_norm_backward_sums_f64(go.data(), x.data(), a, mean.data(), rstd.data(), wp, s1.data(), s2.data()); });
  run([&] { kiln_norm_backward_dx_f64(go.data(), x.data(), a, mean.data(), rstd.data(), wp, s1.data(), s2.data(), dx.data()); });
  run([&] { kiln_layer_norm_param_grads_f64(go.data(), x.data(), a, mean.data(), rstd.data(), dw.data(), db.data()); });
  std::vector<double> rdw(K, 0), rdb(K, 0);
  for (u64 r = 0; r < R; ++r) {
    double m = 0, v = 0;
    for (u64 j = 0; j < K; ++j) m += x[r*K+j]; m /= K;
    for (u64 j = 0; j < K; ++j) v += pow(x[r*K+j]-m, 2); v /= K; double rs = 1/sqrt(v+1e-5);
    near("lmean", mean[r], m); near("lrstd", rstd[r], rs);
    double mg = 0, mgx = 0;
    for (u64 j = 0; j < K; ++j) { double xh = (x[r*K+j]-m)*rs, g = go[r*K+j]*(has_w ? w[j] : 1); mg += g; mgx += g*xh;
      near("ly", y[r*K+j], xh*(has_w ? w[j] : 1) + (has_b ? b[j] : 0)); rdw[j] += go[r*K+j]*xh; rdb[j] += go[r*K+j]; }
    mg /= K; mgx /= K;
    for (u64 j = 0; j < K; ++j) { double xh = (x[r*K+j]-m)*rs, g = go[r*K+j]*(has_w ? w[j] : 1);
      near("ldx", dx[r*K+j], rs*(g - mg - xh*mgx)); }
  }
  for (u64 j = 0; j < K; ++j) { near("ldw", dw[j], rdw[j]); near("ldb", db[j], rdb[j]); }
}
int main() {
  int n = 0;
  for (u64 N : {1, 2, 3}) for (u64 C : {1, 3, 5}) for (u64 S : {1, 7, 49, 70, 130}) for (int f = 0; f < 8; ++f) { batch(N, C, S, f&1, f&2, f&4); n++; }
  for (u64 R : {1, 2, 5}) for (u64 K : {1, 3, 64, 65, 200}) for (int f = 0; f < 4; ++f) { layer(R, K, f&1, f&2); n++; }
  printf("%d cases, %d failures\n", n, fails);
}
