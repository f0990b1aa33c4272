// libFuzzer target for the control plane's message decoders: any bytes, under any message type's header, must
// decode to a valid message or give an error (kCorrupt / kInvalidArgument), never crash, hang or allocate beyond the
// message's own bounds. Built with clang as `fuzz_control` (see CMakeLists.txt); other compilers get a replay driver
// over seed messages of every type, their truncations and random rewrites (ctest label `fuzz`; scripts/
// sanitize_check.sh runs it under ASan+UBSan).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <variant>
#include <vector>

#include "core/rng.h"
#include "tests/fuzz/replay_driver.h"
#include "transport/messages.h"

using namespace lh;

// Every message type, one per alternative of ControlMessage (a new type is fuzzed without editing this file).
constexpr int kTypes = int(std::variant_size_v<ControlMessage>);

// Byte 0 picks the message type the header claims (1..kTypes); the rest is the body. The header is written here so the
// fuzzer spends its time in the body decoders rather than on the magic.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::vector<uint8_t> msg(kControlHeaderBytes + size - 1);
  const uint32_t magic = kControlMagic;
  const uint16_t version = kProtocolVersion, type = uint16_t(1 + data[0] % kTypes);
  const uint32_t seq = 0;
  std::memcpy(msg.data(), &magic, 4);
  std::memcpy(msg.data() + 4, &version, 2);
  std::memcpy(msg.data() + 6, &type, 2);
  std::memcpy(msg.data() + 8, &seq, 4);
  if (size > 1) std::memcpy(msg.data() + kControlHeaderBytes, data + 1, size - 1);
  auto m = decode_message(msg.data(), msg.size());
  if (m.ok()) {
    if (uint16_t(message_type(*m)) != type) std::abort();
    // What decoded must encode and decode again to the same bytes.
    auto again = encode_message(*m);
    auto back = decode_message(again);
    if (!back.ok() || encode_message(*back) != again) std::abort();
  } else if (m.status().code() != StatusCode::kCorrupt && m.status().code() != StatusCode::kInvalidArgument) {
    std::abort();
  }
  return 0;
}

// One valid message of every type: the seed corpus (`--write-corpus DIR`) and the replay inputs.
static std::vector<std::vector<uint8_t>> seed_inputs() {
  Plan plan;
  plan.rank = 1;
  plan.world_size = 2;
  plan.peers = {PeerInfo{0, "a", "cpu", {1, 2, 3}, std::vector<uint8_t>(32, 7), 1}, PeerInfo{1, "b", "cpu", {4, 5}}};
  plan.codecs = {LinkCodec{0, 1, "fwd", "int8"}};
  plan.config = R"({"x":1})";
  plan.shard = {9, 9, 9};
  plan.changes = {SetCodec{0, 1, "fwd", "int4", 7, 3}};
  Heartbeat hb;
  hb.seq = 4;
  hb.step = 3;
  hb.pending = {PendingLink{1, true, 10, 20}};
  hb.join_attempt = 2;
  Join join{"proof", "host", "cpu", 1.5, {1, 2, 3, 4}, 0};
  join.attempt = 1;
  join.data_key.assign(32, 5);
  join.data_ciphers = 1;
  const std::vector<ControlMessage> seeds = {
      join,
      plan,
      Ready{1},
      Barrier{5},
      hb,
      SetCodec{0, 1, "bwd", "ef+int4", 12, 9},
      StepMetrics{1, 3, R"({"loss":2.5})"},
      Shutdown{"done"},
      Reject{"no", 1},
      PeerLost{1, "b", "silent"},
      CtlRequest{"proof", "status", "{}"},
      CtlReply{true, "{}"},
      ShardSaved{1, 3, {1, 2, 3}},
      Rollback{2, "lost"},
      CodecApplied{1, 9, 12, true, ""},
      SetLink{"0-1:fwd=5M,80ms"},
      Preflight{2, {PeerProbe{0, true, "", 12.5f, 95.0f, 65536}, PeerProbe{3, false, "connecting: refused", 0, 0, 0}}},
      Relays{{0, 1}, {2, 3}, "relay.example", 7001}};
  std::vector<std::vector<uint8_t>> out;
  for (const ControlMessage& m : seeds) {
    const std::vector<uint8_t> bytes = encode_message(m);
    std::vector<uint8_t> in{uint8_t(uint16_t(message_type(m)) - 1)};
    in.insert(in.end(), bytes.begin() + kControlHeaderBytes, bytes.end());
    out.push_back(std::move(in));
  }
  return out;
}

#if !defined(LH_LIBFUZZER)
int main(int argc, char** argv) {
  // Without a fuzzer: every seed under every type's header, every truncation, and random rewrites of 1–4 bytes
  // (a bounded count: LH_FUZZ_MUTATIONS per seed, default 2000).
  const char* env = std::getenv("LH_FUZZ_MUTATIONS");
  lh::fuzz::ReplayPlan plan{"fuzz_control", seed_inputs()};
  plan.rng_seed = 1234;
  plan.mutations = env ? std::atoi(env) : 2000;
  plan.max_edits = 4;
  plan.variants = [](const std::vector<uint8_t>& seed) {
    std::vector<std::vector<uint8_t>> out;
    for (int t = 0; t < kTypes; ++t) {
      out.push_back(seed);
      out.back()[0] = uint8_t(t);
    }
    return out;
  };
  return lh::fuzz::replay_main(argc, argv, plan);
}
#endif
