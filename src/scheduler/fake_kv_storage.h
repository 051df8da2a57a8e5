// scheduler/fake_kv_storage.h: a stand-in for model::KvStorage + the model, for tests that
// run the scheduler (or the engine) without a model. Header only; used by tests.
//
// It keeps real data under the ids the cache hands out, so a bookkeeping mistake becomes
// wrong data and a failed check, not a silently "passing" simulation:
//   pages        [num_blocks][block_size] token id written at that position (-1: never)
//   KDA slots    (tokens folded, rolling hash of them), like a recurrent state
//   checkpoints  copies of slots
// Before a sequence computes tokens [start, start + n) it checks that its slot holds exactly
// tokens [0, start) of the request and that its pages hold them too; the "sampled" token is a
// hash of both, so outputs depend only on the request's tokens when the bookkeeping is right.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/cache_config.h"
#include "core/error.h"
#include "scheduler/step_plan.h"

namespace k3::scheduler::testing {

class FakeKvStorage {
 public:
  struct KdaState {
    int64_t num_tokens = -1;  // -1: garbage (never reset or restored)
    uint64_t hash = 0;
  };
  using TokensOf = std::function<std::span<const int32_t>(RequestId)>;

  FakeKvStorage(const cache::CacheConfig& c, int32_t vocab)
      : bs_(c.block_size),
        vocab_(vocab),
        pages_(static_cast<size_t>(c.num_blocks) * static_cast<size_t>(c.block_size), -1),
        slots_(static_cast<size_t>(c.num_slots)),
        checkpoints_(static_cast<size_t>(c.num_checkpoints)) {}

  static uint64_t fold(uint64_t h, int32_t token) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 29);
  }
  static uint64_t fold_all(std::span<const int32_t> t) {
    uint64_t h = 1;
    for (int32_t x : t) h = fold(h, x);
    return h;
  }

  // Runs one step: slot preparation, "forward" of every sequence, checkpoint saves; appends
  // one sampled token per sampling sequence. Throws core::Error describing any inconsistency.
  void run_step(const StepPlan& out, const TokensOf& tokens_of, std::vector<int32_t>& sampled) {
    for (RequestId id : out.preempted) seqs_.erase(id);
    // 1. Slots, for every sequence, before any forward (restores read checkpoints first).
    for (const ScheduledSequence& s : out.seqs) {
      const auto blocks = out.blocks_of(s);
      if (s.fresh()) {
        Seq& q = seqs_[s.id];
        q.table.assign(blocks.begin(), blocks.end());
        q.slot = s.kda_slot;
        q.num_tokens = s.start;
        KdaState& st = slot(s.kda_slot);
        if (s.slot_init == SlotInit::reset) {
          K3_CHECK(s.start == 0, where(s) + "reset slot but start " + std::to_string(s.start));
          st = KdaState{0, 1};
        } else {
          st = checkpoint(s.restore_checkpoint);
        }
      } else {
        auto it = seqs_.find(s.id);
        K3_CHECK(it != seqs_.end(), where(s) + "continues but has no state");
        Seq& q = it->second;
        K3_CHECK(q.slot == s.kda_slot, where(s) + "slot changed");
        K3_CHECK(q.num_tokens == s.start, where(s) + "start " + std::to_string(s.start) + " but the state holds " +
                                              std::to_string(q.num_tokens));
        // Tables are append-only: this step's is the last one's plus any new pages.
        K3_CHECK(blocks.size() >= q.table.size() && std::equal(q.table.begin(), q.table.end(), blocks.begin()),
                 where(s) + "block table is not the previous one extended");
        q.table.assign(blocks.begin(), blocks.end());
      }
    }
    // 2. Forward: check what is read, write what is computed.
    std::vector<uint64_t> digests(out.seqs.size());
    for (size_t i = 0; i < out.seqs.size(); ++i) {
      const ScheduledSequence& s = out.seqs[i];
      Seq& q = seqs_.at(s.id);
      const auto truth = tokens_of(s.id);
      const int64_t end = s.start + s.num_tokens;
      K3_CHECK(end <= static_cast<int64_t>(truth.size()), where(s) + "computes beyond the known tokens");
      K3_CHECK(static_cast<int64_t>(q.table.size()) * bs_ >= end, where(s) + "block table does not cover the step");
      const auto fed = out.tokens_of(s);
      for (int64_t k = 0; k < s.num_tokens; ++k)
        K3_CHECK(fed[static_cast<size_t>(k)] == truth[static_cast<size_t>(s.start + k)],
                 where(s) + "fed a wrong token");
      KdaState& st = slot(q.slot);
      K3_CHECK(st.num_tokens == s.start && st.hash == fold_all(truth.first(static_cast<size_t>(s.start))),
               where(s) + "KDA slot does not hold the request's first " + std::to_string(s.start) + " tokens (holds " +
                   std::to_string(st.num_tokens) + ")");
      uint64_t page_digest = 7;
      for (int64_t p = 0; p < s.start; ++p) {
        const int32_t got = page(q.table, p);
        K3_CHECK(got == truth[static_cast<size_t>(p)],
                 where(s) + "page holds a wrong token at position " + std::to_string(p));
        page_digest = fold(page_digest, got);
      }
      for (int64_t p = s.start; p < end; ++p) {
        page(q.table, p) = truth[static_cast<size_t>(p)];
        st.hash = fold(st.hash, truth[static_cast<size_t>(p)]);
        page_digest = fold(page_digest, truth[static_cast<size_t>(p)]);
      }
      st.num_tokens = end;
      q.num_tokens = end;
      digests[i] = page_digest ^ (st.hash * 31);
    }
    // 3. Saves after the forward.
    for (const ScheduledSequence& s : out.seqs) {
      if (s.save_checkpoint < 0) continue;
      checkpoint(s.save_checkpoint) = slot(s.kda_slot);
      ++saves_;
    }
    for (size_t i = 0; i < out.seqs.size(); ++i)
      if (out.seqs[i].sample) sampled.push_back(static_cast<int32_t>(digests[i] % static_cast<uint64_t>(vocab_)));
  }
  void drop(RequestId id) { seqs_.erase(id); }
  size_t num_sequences() const { return seqs_.size(); }
  int64_t saves() const { return saves_; }

 private:
  struct Seq {
    std::vector<int32_t> table;
    int32_t slot = -1;
    int64_t num_tokens = 0;
  };
  static std::string where(const ScheduledSequence& s) {
    return "fake storage: request " + std::to_string(s.id) + " at " + std::to_string(s.start) + ": ";
  }
  KdaState& slot(int32_t i) {
    K3_CHECK(i >= 0 && static_cast<size_t>(i) < slots_.size(), "fake storage: slot out of range");
    return slots_[static_cast<size_t>(i)];
  }
  KdaState& checkpoint(int32_t i) {
    K3_CHECK(i >= 0 && static_cast<size_t>(i) < checkpoints_.size(), "fake storage: checkpoint out of range");
    return checkpoints_[static_cast<size_t>(i)];
  }
  int32_t& page(const std::vector<int32_t>& table, int64_t pos) {
    const int32_t b = table[static_cast<size_t>(pos / bs_)];
    return pages_[static_cast<size_t>(b) * static_cast<size_t>(bs_) + static_cast<size_t>(pos % bs_)];
  }

  int64_t bs_;
  int32_t vocab_;
  std::vector<int32_t> pages_;
  std::vector<KdaState> slots_, checkpoints_;
  std::unordered_map<RequestId, Seq> seqs_;
  int64_t saves_ = 0;
};

}  // namespace k3::scheduler::testing
