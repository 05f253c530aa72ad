# Sourced by the scripts that build the kernels outside CMake: compile each
# kernel file with its own instruction-set flags, as CMakeLists.txt does.
#   kernel_objs CXX OUTDIR x86|arm [FLAGS...]   -> OUTDIR/*.o
KERNEL_SRC="cpp/verify.cpp cpp/verify_avx2.cpp cpp/verify_avx512.cpp cpp/verify_neon.cpp cpp/warp.cpp"
kernel_objs() {
  local cxx=$1 out=$2 arch=$3; shift 3
  mkdir -p "$out"
  for f in $KERNEL_SRC; do
    local extra=()
    if [ "$arch" = x86 ]; then
      case "$f" in
        *verify_avx2.cpp) extra=(-mavx2) ;;
        *verify_avx512.cpp) extra=(-mavx512f -mavx2 -Wno-uninitialized) ;;  # GCC 12 warns falsely in its intrinsics
      esac
    fi
    case "$cxx" in g++|*-g++) extra+=(-Wno-maybe-uninitialized) ;; esac
    "$cxx" -std=c++17 -ffp-contract=off -fPIC -Icpp "$@" "${extra[@]}" -c "$f" -o "$out/$(basename "$f" .cpp).o"
  done
}
