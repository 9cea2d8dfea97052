#!/usr/bin/env bash
# binary.sh — the release binary starts anywhere: it needs glibc's own
# libraries only (cuBLASLt and NCCL are opened at run time; cudart, zlib,
# libstdc++ and libgcc are linked in), and with the CUDA libraries hidden
# from the loader it still chats, on the CPU, saying why in one line.
# Checks $CLLM (default ./cllm, the user's build) and the sm_90 CUDA build
# tests/run.sh makes (./build.sh --cuda-archs 90), which runs the chat with
# the libraries hidden. Hiding needs root (a private mount namespace:
# unshare --mount), as CI runs.
source "$(dirname "$0")/lib.sh"
FIX=${CLLM_FIXTURES:-tests/fixtures}
GLIBC='^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1)$'

# NAME BINARY: its NEEDED entries are glibc's, and no RPATH/RUNPATH points elsewhere.
needs_glibc_only() {
    if [ ! -x "$2" ]; then notok "$1" "$2: no such binary (./build.sh builds it)"; return; fi
    local needed bad rpath
    needed=$(readelf -d "$2" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p')
    bad=$(echo "$needed" | grep -vE "$GLIBC")
    rpath=$(readelf -d "$2" | grep -E '\((RPATH|RUNPATH)\)')
    if [ -n "$needed" ] && [ -z "$bad" ] && [ -z "$rpath" ]; then ok "$1"
    else notok "$1" "NEEDED: $(echo $needed)" "not glibc's: $(echo $bad)" "$rpath"; fi
}
needs_glibc_only "binary: $CLLM needs glibc's libraries only" "$CLLM"
CUDA_BIN=$(./build.sh --cuda-archs 90 --print-dir)/cllm
needs_glibc_only "binary: $CUDA_BIN (./build.sh --cuda-archs 90) needs glibc's libraries only" "$CUDA_BIN"
grep -q 'libcublasLt\.so\.13' "$CUDA_BIN" 2>/dev/null && ok "binary: $CUDA_BIN is a CUDA build" \
    || notok "binary: $CUDA_BIN is a CUDA build" "it names no libcublasLt.so.13 (CI compiles the CUDA code: tests/run.sh)"

# Run inside a private mount namespace: every folder and file where the
# loader could find cuBLASLt or NCCL is covered (the CUDA folders by an
# empty tmpfs, any other copy by /dev/null), the loader is asked for each
# (LD_PRELOAD: the same search as dlopen), then cllm chats.
cat > "$TMP/hidden.sh" <<'EOF'
set -u
bin=$1 model=$2 out=$3
for d in /usr/local/cuda* /opt/cuda* /opt/nvidia; do
    [ -d "$d" ] && mount -t tmpfs none "$(readlink -f "$d")"
done
{ ldconfig -p | sed -n 's/^\s*lib\(cublasLt\|nccl\)\.so.* => //p'
  find /lib /lib64 /usr/lib /usr/lib64 /usr/local/lib -maxdepth 2 \( -name 'libcublasLt.so*' -o -name 'libnccl.so*' \) 2>/dev/null
  echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | while read -r d; do [ -n "$d" ] && ls "$d"/libcublasLt.so* "$d"/libnccl.so* 2>/dev/null; done
} | while read -r f; do [ -e "$f" ] && mount --bind /dev/null "$(readlink -f "$f")"; done
unset LD_LIBRARY_PATH
for lib in libcublasLt.so.13 libnccl.so.2; do
    probe=$(LD_PRELOAD=$lib /bin/true 2>&1)
    case $probe in *"cannot be preloaded"*) echo "hidden $lib" ;; *) echo "REACHABLE $lib: $probe" ;; esac
done > "$out/probe"
printf 'hi\n' | "$bin" chat -m "$model" --temp 0 -n 8 > "$out/chat" 2> "$out/chat.err"
echo $? > "$out/rc"
EOF
unshare --mount --propagation private bash "$TMP/hidden.sh" "$(readlink -f "$CUDA_BIN")" "$FIX/tiny/llama.gguf" "$TMP" \
    > "$TMP/unshare.log" 2>&1
if [ -s "$TMP/probe" ] && ! grep -q REACHABLE "$TMP/probe" && [ "$(grep -c '^hidden' "$TMP/probe")" = 2 ]; then
    ok "binary: cuBLASLt and NCCL unreachable in the namespace"
else
    notok "binary: cuBLASLt and NCCL unreachable in the namespace" "$(cat "$TMP/probe" 2>/dev/null)" \
        "unshare (needs root): $(head -c 400 "$TMP/unshare.log")"
fi
rc=$(cat "$TMP/rc" 2>/dev/null || echo none)
[ "$rc" = 0 ] && [ -s "$TMP/chat" ] && ok "binary: chats with the CUDA libraries hidden" \
    || notok "binary: chats with the CUDA libraries hidden" "exit $rc" "stderr: $(head -c 400 "$TMP/chat.err" 2>/dev/null)"
printf 'hi\n' | "$CLLM" chat -m "$FIX/tiny/llama.gguf" --cpu --temp 0 -n 8 > "$TMP/chat.cpu" 2>/dev/null
cmp -s <(grep -v "^\[prompt" "$TMP/chat") <(grep -v "^\[prompt" "$TMP/chat.cpu") && ok "binary: the same reply as --cpu" \
    || notok "binary: the same reply as --cpu" "$(diff "$TMP/chat" "$TMP/chat.cpu" | head)"
# The CUDA build says in one line why it runs on the CPU.
if grep -q 'libcublasLt\.so\.13' "$CUDA_BIN"; then
    why=$(grep -cE '^cllm: (no CUDA device|GPU found but libcublasLt\.so\.13 not found: .*); running on the CPU$' "$TMP/chat.err")
    [ "$why" = 1 ] && [ "$(grep -c 'running on the CPU' "$TMP/chat.err")" = 1 ] \
        && ok "binary: one line says why it runs on the CPU" \
        || notok "binary: one line says why it runs on the CPU" "stderr: $(head -c 400 "$TMP/chat.err")"
fi
