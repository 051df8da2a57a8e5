// comm/rank_wait_test_util.h: waiting on a rank's state instead of the clock. A rank announces
// its thread id just before it calls a collective; a peer that needs it blocked there (to throw,
// to abort, or to arrive last) waits until that thread sleeps in the kernel - on the collective's
// mutex or condition variable, the only place it can sleep after announcing - instead of sleeping
// 20 ms and hoping. Linux: the state is field 3 of /proc/self/task/<tid>/stat.
#pragma once
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace k3::comm::testing {

inline pid_t this_thread_id() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// True while thread `tid` of this process is asleep in the kernel (state S).
inline bool thread_asleep(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');  // the thread name may hold spaces and parentheses
  return name_end != std::string::npos && name_end + 2 < stat.size() && stat[name_end + 2] == 'S';
}

// One announced thread id per rank (0 until the rank announces).
struct RankThreads {
  explicit RankThreads(int n) : tids(static_cast<size_t>(n)) {}
  void announce(int rank) { tids[static_cast<size_t>(rank)].store(this_thread_id()); }
  std::vector<std::atomic<pid_t>> tids;
};

// Waits until each rank in `ranks` has announced and is asleep. The limit only guards against a
// hang (it is far beyond any scheduling delay); past it, returns what never happened, else "".
inline std::string wait_until_asleep(const RankThreads& threads, const std::vector<int>& ranks,
                                     const std::string& where, std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    std::string missing;
    for (int r : ranks) {
      const pid_t tid = threads.tids[static_cast<size_t>(r)].load();
      if (tid == 0 || !thread_asleep(tid)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (missing.empty()) return "";
    if (std::chrono::steady_clock::now() >= until)
      return "rank(s) " + missing + " never blocked in " + where + " (waited " + std::to_string(limit.count()) + " s)";
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a poll, not a timing
  }
}

}  // namespace k3::comm::testing
