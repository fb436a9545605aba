#!/usr/bin/env bash
# Pack binaries built on this machine for the GPU machine, so that a device call can skip its
# ~3-minute build (device time is the scarce resource):
#   bash bench/pack_devbin.sh [BUILD_DIR]      (default build; it must hold mxlab and mxlab_gpu_tests,
#                                               built for sm_90: cmake ... -DCMAKE_BUILD_TYPE=Release)
# writes .devbin/ (git-ignored): bin/mxlab.xz, bin/mxlab_gpu_tests.xz (and bin/bench_*_gpu.xz for the
# GPU benchmark programs that are built), lib/ with every shared library
# they load from this machine except the C runtime (libc, libm, libstdc++, ...) and CUDA's (the
# device has both, at least as new), REVISION, and the wrappers .devbin/mxlab and
# .devbin/mxlab_gpu_tests, which run the binaries with LD_LIBRARY_PATH=.devbin/lib (only them:
# the device's Python and h5py keep its own HDF5). Name .devbin in the call's carry; then
#   bash bench/device_parts.sh $OUT DEADLINE gputests bench ...
# uses them. The device is x86-64 like this machine; glibc and libstdc++ there are newer, which is
# the direction that works.
#   bash bench/pack_devbin.sh --compact [BUILD_DIR]
# packs only the libraries the GPU machine (Ubuntu 24.04) lacks: those named in MXLAB_DEVBIN_LIBS
# (default: Debian 12's HDF5 1.10 and yaml-cpp 0.7 with HDF5's libsz and libaec; the others it loads
# are there with the same names), xz-compressed as .devbin/lib.txz (~1.3 MB instead of ~15 MB of
# lib/: the tracked tree and .devbin must fit the 64 MiB a call carries); each wrapper unpacks it
# into .devbin/lib on first use (Python's tarfile: no xz needed there), once, also when several
# start at the same time. A named library the binaries do not load is an error.
#   bash bench/pack_devbin.sh --ref [BUILD_DIR]
# packs the *baseline* of a performance comparison instead: only mxlab, stripped and xz-compressed
# (~8 MB: .devbin and .devref together fit the 64 MiB a call carries), into .devref/ (git-ignored)
# with REVISION and the wrapper .devref/mxlab, which unpacks it on first use and runs it with
# .devbin/lib (build both on this machine: the same libraries). Carry .devref beside .devbin;
# device_parts.sh's refbench and paired10k then use it instead of building .ref on the device.
set -euo pipefail
if [ "${1:-}" = --ref ]; then
  BUILD=${2:-build}
  [ -x "$BUILD/mxlab" ] || { echo "pack_devbin: $BUILD/mxlab is missing: build it first" >&2; exit 2; }
  command -v xz > /dev/null || { echo "pack_devbin: --ref needs xz (apt-get install xz-utils)" >&2; exit 2; }
  rm -rf .devref
  mkdir -p .devref/bin
  strip --strip-unneeded -o .devref/bin/mxlab.tmp "$BUILD/mxlab"
  xz -T0 -6 -c .devref/bin/mxlab.tmp > .devref/bin/mxlab.xz
  rm .devref/bin/mxlab.tmp
  cat > .devref/mxlab <<'WRAP'
#!/usr/bin/env bash
# bench/pack_devbin.sh --ref: the baseline mxlab, unpacked on first use, with .devbin's libraries.
d=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$d/bin/mxlab" ]; then
  if command -v xz > /dev/null; then xz -dc "$d/bin/mxlab.xz" > "$d/bin/mxlab.$$"
  else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
         "$d/bin/mxlab.xz" "$d/bin/mxlab.$$"; fi &&
    chmod +x "$d/bin/mxlab.$$" && mv "$d/bin/mxlab.$$" "$d/bin/mxlab" ||
    { echo "devref: could not unpack $d/bin/mxlab.xz" >&2; exit 2; }
fi
LD_LIBRARY_PATH="$d/../.devbin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/mxlab" "$@"
WRAP
  chmod +x .devref/mxlab
  git rev-parse HEAD > .devref/REVISION
  git status --porcelain --untracked-files=no | grep -q . && echo "dirty" >> .devref/REVISION || true
  du -sh .devref | awk '{print "pack_devbin: .devref is " $1}'
  cat .devref/REVISION
  exit 0
fi
COMPACT=""
if [ "${1:-}" = --compact ]; then COMPACT=1; shift; fi
BUILD=${1:-build}
for b in mxlab mxlab_gpu_tests; do
  [ -x "$BUILD/$b" ] || { echo "pack_devbin: $BUILD/$b is missing: build it first (ninja/make mxlab mxlab_gpu_tests)" >&2; exit 2; }
done
[ "$(uname -m)" = x86_64 ] || { echo "pack_devbin: this machine is $(uname -m); the device is x86-64" >&2; exit 2; }
rm -rf .devbin
mkdir -p .devbin/lib .devbin/bin
command -v xz > /dev/null || { echo "pack_devbin: needs xz (apt-get install xz-utils)" >&2; exit 2; }
# Stripped (symbols are a third of the size) and xz-compressed (the tracked tree, .devbin and
# .devref must fit the 64 MiB a call carries); each wrapper unpacks its binary on first use.
# The GPU benchmark programs (bench/*.cu: bench_quantize_gpu, bench_gelu_gpu) come along when built.
PROGRAMS="mxlab mxlab_gpu_tests"
for b in $(cd "$BUILD" && ls bench_*_gpu 2> /dev/null); do [ -x "$BUILD/$b" ] && PROGRAMS="$PROGRAMS $b"; done
for b in $PROGRAMS; do
  strip --strip-unneeded -o ".devbin/bin/$b.tmp" "$BUILD/$b"
  xz -T0 -6 -c ".devbin/bin/$b.tmp" > ".devbin/bin/$b.xz"
  rm ".devbin/bin/$b.tmp"
  # The GPU tests that start mxlab run the one carried beside them (the build's path, compiled into
  # them, is not on the device); MXLAB_TEST_BINARY set by the caller wins.
  test_binary=""
  [ "$b" = mxlab_gpu_tests ] && test_binary='[ -n "${MXLAB_TEST_BINARY:-}" ] || export MXLAB_TEST_BINARY="$d/mxlab"'
  cat > ".devbin/$b" <<WRAP
#!/usr/bin/env bash
# bench/pack_devbin.sh: $b built on the development machine (unpacked on first use), with the
# libraries it was linked to.
d=\$(cd "\$(dirname "\$0")" && pwd)
if [ ! -x "\$d/bin/$b" ]; then
  if command -v xz > /dev/null; then xz -dc "\$d/bin/$b.xz" > "\$d/bin/$b.\$\$"
  else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \\
         "\$d/bin/$b.xz" "\$d/bin/$b.\$\$"; fi &&
    chmod +x "\$d/bin/$b.\$\$" && mv "\$d/bin/$b.\$\$" "\$d/bin/$b" ||
    { echo "devbin: could not unpack \$d/bin/$b.xz" >&2; exit 2; }
fi
# --compact: the libraries come as lib.txz, unpacked here once (a wrapper that loses the race to
# another one started at the same time leaves that one's lib/ as it is)
if [ ! -d "\$d/lib" ] && [ -f "\$d/lib.txz" ]; then
  t=\$(mktemp -d "\$d/.lib.XXXXXX") &&
    python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
t.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' "\$d/lib.txz" "\$t" &&
    { mv -T "\$t/lib" "\$d/lib" 2> /dev/null || [ -d "\$d/lib" ]; } ||
    { echo "devbin: could not unpack \$d/lib.txz" >&2; rm -rf "\$t"; exit 2; }
  rm -rf "\$t"
fi
$test_binary
LD_LIBRARY_PATH="\$d/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$d/bin/$b" "\$@"
WRAP
  chmod +x ".devbin/$b"
done
git rev-parse HEAD > .devbin/REVISION
git status --porcelain --untracked-files=no | grep -q . && echo "dirty" >> .devbin/REVISION || true
# Libraries the C runtime and the CUDA driver/toolkit provide on the device: not packed.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libnvidia)'
for b in $PROGRAMS; do
  ldd "$BUILD/$b" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  cp -L "$path" ".devbin/lib/$name"
done
if [ -n "$COMPACT" ]; then
  keep=${MXLAB_DEVBIN_LIBS:-libhdf5_serial.so.103 libsz.so.2 libaec.so.0 libyaml-cpp.so.0.7}
  for name in $keep; do
    [ -f ".devbin/lib/$name" ] || { echo "pack_devbin: --compact: the binaries load no $name (MXLAB_DEVBIN_LIBS)" >&2; exit 2; }
  done
  for f in .devbin/lib/*; do
    [ -e "$f" ] || continue
    case " $keep " in *" $(basename "$f") "*) ;; *) rm "$f" ;; esac
  done
  tar cJf .devbin/lib.txz -C .devbin lib
  rm -r .devbin/lib
  echo "pack_devbin: --compact: $keep in .devbin/lib.txz"
fi
du -sh .devbin | awk '{print "pack_devbin: .devbin is " $1 " (the working tree that travels may be 64 MiB)"}'
cat .devbin/REVISION
