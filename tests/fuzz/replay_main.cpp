// A main() for the fuzz harnesses without libFuzzer: runs LLVMFuzzerTestOneInput once on every file given, or on
// every file (recursively, sorted) under each directory given. Built with the regular compiler as fuzz_replay_<name>
// and run by CTest over tests/fuzz/corpus/<name> and tests/fuzz/regressions/<name>, so the harnesses keep compiling
// and every input that once crashed is checked in the regular and sanitizer builds.
//
// A finding ends the process the way it would under libFuzzer (abort, sanitizer report, uncaught exception); the
// file being run is printed first so the failing input is named. Without AddressSanitizer the address space is
// capped (CIDER_FUZZ_REPLAY_MEM_MB, default 4096) so that a runaway allocation fails fast instead of swapping.
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

#if defined(__SANITIZE_ADDRESS__)
#define CIDER_REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CIDER_REPLAY_ASAN 1
#endif
#endif

namespace fs = std::filesystem;

int main(int argc, char** argv) {
#ifndef CIDER_REPLAY_ASAN
  {
    const char* env = std::getenv("CIDER_FUZZ_REPLAY_MEM_MB");
    const unsigned long long mb = env && *env ? std::strtoull(env, nullptr, 10) : 4096ull;
    if (mb > 0) {
      const rlimit lim{static_cast<rlim_t>(mb) << 20, static_cast<rlim_t>(mb) << 20};
      setrlimit(RLIMIT_AS, &lim);
    }
  }
#endif
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(p, ec))
        if (e.is_regular_file() && e.path().filename().string().rfind('.', 0) != 0) files.push_back(e.path());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else if (!fs::exists(p, ec)) {
      continue;  // an empty corpus or regressions directory may not exist in a checkout: nothing to replay
    } else {
      std::fprintf(stderr, "replay: %s is neither a file nor a directory\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "replay: cannot read %s\n", f.c_str());
      return 2;
    }
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", f.c_str(), bytes.size());
    std::fflush(stderr);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::fprintf(stderr, "replay: %zu inputs, no finding\n", files.size());
  return 0;
}
