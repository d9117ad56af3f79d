// Empty: cuda_host.h defines the 16-bit types the kernels use (as f32 stand-ins).
