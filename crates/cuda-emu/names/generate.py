#!/usr/bin/env python3
"""Regenerates the name lists in this folder from cudarc's bindings (run once per cudarc upgrade).

Usage: generate.py PATH_TO_CUDARC_SRC   (e.g. ~/.cargo/registry/src/*/cudarc-0.19.10/src)

Writes, one entry a line, sorted:
- driver.txt, nvrtc.txt, cublas.txt, nccl.txt: every symbol name cudarc's dynamic loader asks
  each library for (the strings in its `load::<_F>("...")` calls), over all CUDA versions;
- cuda_errors.txt: `VALUE NAME` of every CUresult of the CUDA version kiln builds for.
build.rs reads these lists; nothing else does.
"""
import pathlib
import re
import sys

CUDA_FEATURE = "cuda-13000"


def load_names(text):
    return sorted(set(re.findall(r'load::<_F>\("([A-Za-z0-9_]+)"\)', text)))


def error_codes(text):
    # The CUresult enum whose cfg list names CUDA_FEATURE.
    pattern = re.compile(
        r'#\[cfg\(any\(([^)]*)\)\)\]\s*#\[repr\(u32\)\]\s*#\[derive\([^)]*\)\]\s*'
        r'pub enum cudaError_enum \{(.*?)\}', re.S)
    for cfg, body in pattern.findall(text):
        if f'"{CUDA_FEATURE}"' in cfg:
            pairs = re.findall(r'(CUDA_[A-Z0-9_]+) = (\d+),', body)
            return sorted((int(v), n) for n, v in pairs)
    raise SystemExit(f"no cudaError_enum for {CUDA_FEATURE}")


def main():
    src = pathlib.Path(sys.argv[1])
    here = pathlib.Path(__file__).resolve().parent
    for lib in ["driver", "nvrtc", "cublas", "nccl"]:
        text = (src / lib / "sys" / "mod.rs").read_text()
        (here / f"{lib}.txt").write_text("".join(n + "\n" for n in load_names(text)))
    driver = (src / "driver" / "sys" / "mod.rs").read_text()
    lines = "".join(f"{v} {n}\n" for v, n in error_codes(driver))
    (here / "cuda_errors.txt").write_text(lines)


if __name__ == "__main__":
    main()
