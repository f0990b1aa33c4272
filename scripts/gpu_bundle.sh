#!/usr/bin/env bash
# Pack a CUDA build made here for a lent GPU machine that cannot install Debian packages (nothing can
# be fetched there): the stripped `longhaul` binary, every *_gpu test executable and the shared
# libraries they need that a plain CUDA image lacks (UCX with its transport modules, ZeroMQ, OpenBLAS,
# spdlog, ...), into one xz tarball. cuBLAS, libc and libstdc++ are taken from the GPU machine.
#
#   cmake -S . -B build-gpu -G Ninja -DLH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-gpu -j2 --target longhaul $(the *_gpu tests)
#   bash scripts/gpu_bundle.sh build-gpu .gpu/bundle.tar.xz
#
# scripts/gpu_check.sh unpacks it when LH_GPU_BUNDLE names it, and then builds nothing.
set -euo pipefail
BUILD_DIR=${1:-build-gpu}
OUT_FILE=${2:-.gpu/bundle.tar.xz}
cd "$(dirname "$0")/.."
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib/ucx"

bins=("$BUILD_DIR/bin/longhaul")
for t in $(find tests -name 'test_*_gpu.cpp' | sed -E 's#^tests/([^/]+)/.*#\1_gpu_tests#' | sort -u); do
  [ -x "$BUILD_DIR/bin/$t" ] || { echo "gpu_bundle: $BUILD_DIR/bin/$t is not built" >&2; exit 1; }
  bins+=("$BUILD_DIR/bin/$t")
done
for b in "${bins[@]}"; do
  strip -o "$STAGE/bin/$(basename "$b")" "$b"
done

# Libraries the binaries load, less what every Linux (glibc, libstdc++, libgcc) or the CUDA image
# (cuBLAS) has. -L copies the file a Debian alternatives link (libopenblas.so.0) points to.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libstdc\+\+|libgcc_s|libpthread|libdl\.|librt\.|libresolv|libcublas|libcuda)'
for b in "${bins[@]}"; do ldd "$b"; done | awk '$3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ $name =~ $skip ]] && continue
    cp -L "$path" "$STAGE/lib/$name"
  done
# UCX finds its transport modules in <dir of libucs>/ucx. cma is the only one without RDMA libraries.
for m in /usr/lib/x86_64-linux-gnu/ucx/libuct_cma.so.0; do
  [ -e "$m" ] && cp -L "$m" "$STAGE/lib/ucx/$(basename "$m")"
done
# The default corpus (Debian's fortunes) as one text file, for `--data`.
mkdir -p "$STAGE/data"
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -exec cat {} + >"$STAGE/data/corpus.txt"
mkdir -p "$(dirname "$OUT_FILE")"
tar -C "$STAGE" -cJf "$OUT_FILE" bin lib data
echo "gpu_bundle: $OUT_FILE $(du -h "$OUT_FILE" | cut -f1) ($(ls "$STAGE/bin" | wc -l) binaries, $(ls "$STAGE/lib" | wc -l) libraries)"
