// comm/thread_comm.h: CPU communicators for N ranks that are N threads of one process.
//
// This is the oracle for tensor parallelism: CI runs TP=2/4/8 on a 2-core machine with it and
// compares against TP=1. A ThreadGroup owns the shared state (published tensor pointers, a scratch
// buffer, a generation-counted barrier) and hands out one Communicator per rank; rank r's
// Communicator is used by exactly one thread at a time.
//
// How a collective runs (two barriers, no copies of the inputs):
//   1. every rank publishes (op, pointers, dtype, shape) in its slot and arrives at barrier A; the
//      last to arrive checks that all ranks called the same op with matching tensors;
//   2. each rank reads its peers' tensors directly (sums are taken in rank order 0..n-1 per element,
//      all_reduce splits the elements so each rank sums a slice into the shared scratch);
//   3. barrier B: after it no rank reads another rank's tensor, so callers may reuse them.
//   (all_reduce copies the scratch back into x after B; the next call's barrier A protects it.)
//
// Failure: a rank that throws must not leave the others waiting forever. ThreadGroup::abort (also
// Communicator::abort, and run_ranks does it for you) wakes every waiting rank with core::Error,
// and every later collective on the group throws too.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace k3::comm {

struct ThreadShared;  // shared state, defined in thread_comm.cpp

class ThreadGroup {
 public:
  explicit ThreadGroup(int n_ranks);
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const;
  // Rank r's communicator (lives as long as the group). Use each from one thread at a time.
  Communicator& rank(int r);
  // Wakes every rank waiting in a collective with core::Error("... aborted: <reason>"); later
  // collectives throw the same. The first reason given is kept.
  void abort(const std::string& reason);
  bool aborted() const;

 private:
  std::shared_ptr<ThreadShared> shared_;
  std::unique_ptr<std::unique_ptr<Communicator>[]> ranks_;
};

// Runs fn(comm) on n new threads, one per rank of a fresh ThreadGroup, and joins them. If any rank
// throws, the group is aborted (so the others stop waiting) and the first exception thrown is
// rethrown here after all threads have finished.
void run_ranks(int n_ranks, const std::function<void(Communicator&)>& fn);
// Same on an existing group (e.g. to keep the group's scratch between runs).
void run_ranks(ThreadGroup& group, const std::function<void(Communicator&)>& fn);

}  // namespace k3::comm
