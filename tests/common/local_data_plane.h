// defines: LocalDataPlane — an in-process DataPlane joined to others through a shared LocalFabric, so a
// test can run every pipeline stage on its own thread without sockets. Used by the comm, runtime and transport tests.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "transport/data_plane.h"

namespace lh {

// Packets in flight between ranks, matched by (src, dst, tag) in send order.
struct LocalFabric {
  std::mutex mu;
  using Key = std::tuple<int, int, uint64_t>;
  std::map<Key, std::deque<Bytes>> queued;
  std::map<Key, std::deque<std::shared_ptr<TransferState>>> waiting;
  std::set<std::pair<int, int>> failed;  // (rank, peer) pairs cut by fail_peer
};

class LocalDataPlane final : public DataPlane {
 public:
  LocalDataPlane(std::shared_ptr<LocalFabric> fabric, int rank, int world) : fabric_(std::move(fabric)), rank_(rank) {
    for (int r = 0; r < world; ++r)
      if (r != rank) peers_.push_back(r);
  }
  int rank() const override { return rank_; }
  std::vector<int> peers() const override { return peers_; }
  void fail_peer(int peer, const std::string& reason) override {
    std::vector<std::shared_ptr<TransferState>> failing;
    {
      std::lock_guard<std::mutex> lock(fabric_->mu);
      fabric_->failed.insert({rank_, peer});
      for (auto& [key, q] : fabric_->waiting)
        if (std::get<0>(key) == peer && std::get<1>(key) == rank_) {
          failing.insert(failing.end(), q.begin(), q.end());
          q.clear();
        }
    }
    for (auto& st : failing) st->complete(unavailable("peer " + std::to_string(peer) + " failed: " + reason));
  }

 protected:
  void start_send(std::shared_ptr<TransferState> st) override {
    Bytes bytes(st->data, st->data + st->size);
    std::shared_ptr<TransferState> match;
    {
      std::lock_guard<std::mutex> lock(fabric_->mu);
      if (fabric_->failed.count({rank_, st->peer})) {
        st->complete(unavailable("peer " + std::to_string(st->peer) + " failed"));
        return;
      }
      auto& waiting = fabric_->waiting[{rank_, st->peer, st->tag.pack()}];
      if (!waiting.empty()) {
        match = waiting.front();
        waiting.pop_front();
      } else {
        fabric_->queued[{rank_, st->peer, st->tag.pack()}].push_back(bytes);
      }
    }
    st->t_end = Clock::now();
    if (match) deliver(match, std::move(bytes));
    st->complete(Status::Ok());
  }
  void start_recv(std::shared_ptr<TransferState> st) override {
    Bytes bytes;
    {
      std::lock_guard<std::mutex> lock(fabric_->mu);
      if (fabric_->failed.count({rank_, st->peer})) {
        st->complete(unavailable("peer " + std::to_string(st->peer) + " failed"));
        return;
      }
      auto& queued = fabric_->queued[{st->peer, rank_, st->tag.pack()}];
      if (queued.empty()) {
        fabric_->waiting[{st->peer, rank_, st->tag.pack()}].push_back(st);
        return;
      }
      bytes = std::move(queued.front());
      queued.pop_front();
    }
    deliver(st, std::move(bytes));
  }

 private:
  static void deliver(const std::shared_ptr<TransferState>& st, Bytes bytes) {
    st->wire_bytes = bytes.size();
    st->owned = std::move(bytes);
    st->t_end = Clock::now();
    st->complete(Status::Ok());
  }
  std::shared_ptr<LocalFabric> fabric_;
  int rank_;
  std::vector<int> peers_;
};

}  // namespace lh
