#!/usr/bin/env bash
# Pack binaries built on this machine for the GPU machine, so that a device call can skip its
# ~3-minute build (device time is the scarce resource):
#   bash bench/pack_devbin.sh [BUILD_DIR]      (default build; it must hold mxlab and mxlab_gpu_tests,
#                                               built for sm_90: cmake ... -DCMAKE_BUILD_TYPE=Release)
# writes .devbin/ (git-ignored): bin/mxlab, bin/mxlab_gpu_tests, lib/ with every shared library
# they load from this machine except the C runtime (libc, libm, libstdc++, ...) and CUDA's (the
# device has both, at least as new), REVISION, and the wrappers .devbin/mxlab and
# .devbin/mxlab_gpu_tests, which run the binaries with LD_LIBRARY_PATH=.devbin/lib (only them:
# the device's Python and h5py keep its own HDF5). Name .devbin in the call's carry; then
#   bash bench/device_parts.sh $OUT DEADLINE gputests bench ...
# uses them. The device is x86-64 like this machine; glibc and libstdc++ there are newer, which is
# the direction that works.
set -euo pipefail
BUILD=${1:-build}
for b in mxlab mxlab_gpu_tests; do
  [ -x "$BUILD/$b" ] || { echo "pack_devbin: $BUILD/$b is missing: build it first (ninja/make mxlab mxlab_gpu_tests)" >&2; exit 2; }
done
[ "$(uname -m)" = x86_64 ] || { echo "pack_devbin: this machine is $(uname -m); the device is x86-64" >&2; exit 2; }
rm -rf .devbin
mkdir -p .devbin/lib .devbin/bin
cp "$BUILD/mxlab" "$BUILD/mxlab_gpu_tests" .devbin/bin/
strip --strip-unneeded .devbin/bin/mxlab .devbin/bin/mxlab_gpu_tests  # symbols: a third of the size
for b in mxlab mxlab_gpu_tests; do
  cat > ".devbin/$b" <<WRAP
#!/usr/bin/env bash
# bench/pack_devbin.sh: $b built on the development machine, with the libraries it was linked to.
d=\$(cd "\$(dirname "\$0")" && pwd)
LD_LIBRARY_PATH="\$d/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$d/bin/$b" "\$@"
WRAP
  chmod +x ".devbin/$b"
done
git rev-parse HEAD > .devbin/REVISION
git status --porcelain --untracked-files=no | grep -q . && echo "dirty" >> .devbin/REVISION || true
# Libraries the C runtime and the CUDA driver/toolkit provide on the device: not packed.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libnvidia)'
for b in mxlab mxlab_gpu_tests; do
  ldd "$BUILD/$b" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  cp -L "$path" ".devbin/lib/$name"
done
du -sh .devbin | awk '{print "pack_devbin: .devbin is " $1 " (the working tree that travels may be 64 MiB)"}'
cat .devbin/REVISION
