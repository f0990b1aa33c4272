// `longhaul ctl --coordinator ADDR status | set-codec (--link A-B --dir fwd|bwd | --role grad|tp) SPEC | set-link
// RULE | page-url`: talk to a running job's coordinator — print its plan, codecs and measured bandwidth per link, or
// switch a link's codec live.
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/job_cli.h"
#include "compress/spec.h"
#include "grid/link_shapes.h"
#include "transport/control_client.h"

namespace lh::app {
namespace {

struct CtlFlags {
  std::string coordinator;
  SecretFlags secret;
  double timeout_s = 10;
  bool timeout_given = false;
  bool json = false;
  std::string link, dir, role, spec;
};

nlohmann::json request(const CtlFlags& f, const std::string& command, const std::string& args) {
  if (f.coordinator.rfind("tcp://", 0) != 0) fail("--coordinator '" + f.coordinator + "': expected tcp://HOST:PORT", 2);
  const JobSecret secret = required_secret(f.secret, "ctl");
  CtlRequest req{secret.join_proof(), command, args};
  // set-codec replies once every worker has acknowledged the change, at its next step boundary: a step may take
  // minutes over slow links.
  const double timeout_s = command == "set-codec" && !f.timeout_given ? 600 : f.timeout_s;
  auto reply =
      ctl_request(f.coordinator, req, std::chrono::milliseconds(int64_t(timeout_s * 1000)), secret.client_curve());
  if (!reply.ok()) fail("--coordinator " + f.coordinator + ": " + reply.status().message());
  if (!reply->ok) fail(command + ": " + reply->body);
  auto j = nlohmann::json::parse(reply->body, nullptr, false);
  if (j.is_discarded()) fail(command + ": the coordinator's reply is not JSON: " + reply->body);
  return j;
}

void print_status(const nlohmann::json& j) {
  const auto& job = j.value("job", nlohmann::json::object());
  const auto& tr = job.value("train", nlohmann::json::object());
  std::printf("step %lld of %lld; %d workers, pp %d, tp %d, dp %d, partition %s, schedule %s, %d microbatches\n",
              static_cast<long long>(j.value("step", int64_t(-1))),
              static_cast<long long>(tr.value("steps", int64_t(0))), job.value("workers", 0), job.value("pp", 0),
              job.value("tp", 1), job.value("dp", 1), j.value("partition", std::string("?")).c_str(),
              j.value("schedule", std::string("?")).c_str(), job.value("microbatches", 0));
  std::printf("\n%-8s %-4s %-24s %10s %10s %14s\n", "link", "dir", "codec", "raw MB", "wire MB", "measured Mbit/s");
  for (const auto& l : j.value("links", nlohmann::json::array())) {
    std::printf(
        "%-8s %-4s %-24s %10.2f %10.2f %14s\n", l.value("link", std::string()).c_str(),
        l.value("dir", std::string()).c_str(), l.value("spec", std::string()).c_str(),
        double(l.value("raw_bytes", uint64_t(0))) / 1e6, double(l.value("wire_bytes", uint64_t(0))) / 1e6,
        l.contains("measured_bps") ? std::to_string(l["measured_bps"].get<double>() / 1e6).substr(0, 8).c_str() : "-");
  }
  const auto& changes = j.value("codec_changes", nlohmann::json::array());
  if (!changes.empty()) {
    std::printf("\ncodec changes\n");
    for (const auto& c : changes)
      std::printf("  link %s %s -> %s from step %lld\n", c.value("link", std::string()).c_str(),
                  c.value("dir", std::string()).c_str(), c.value("spec", std::string()).c_str(),
                  static_cast<long long>(c.value("from_step", int64_t(0))));
  }
  const auto& w = j.value("workers", nlohmann::json::object());
  std::printf("\n%-5s %-32s %-8s %s\n", "rank", "host", "state", "silent ms");
  for (const auto& x : w.value("workers", nlohmann::json::array()))
    std::printf("%-5d %-32s %-8s %lld\n", x.value("rank", -1), x.value("hostname", std::string()).c_str(),
                x.value("state", std::string()).c_str(), static_cast<long long>(x.value("silent_ms", int64_t(0))));
  const auto& preflight = w.value("preflight", nlohmann::json::array());
  if (!preflight.empty()) {
    std::printf("\npre-flight (this epoch)\n%-16s %-9s %-8s %10s %12s  %s\n", "link", "ranks", "path", "rtt ms",
                "send Mbit/s", "error");
    for (const auto& p : preflight) {
      const std::string ranks = std::to_string(p.value("src", -1)) + "->" + std::to_string(p.value("dst", -1));
      const bool ok = p.value("ok", false);
      const double mbps = p.value("mbps", 0.0);
      std::printf("%-16s %-9s %-8s %10.2f %12s  %s\n", p.value("link", std::string()).c_str(), ranks.c_str(),
                  !ok                         ? "none"
                  : p.value("relayed", false) ? "relayed"
                                              : "direct",
                  p.value("rtt_ms", 0.0), mbps > 0 ? std::to_string(mbps).substr(0, 8).c_str() : "-",
                  p.value("error", std::string()).c_str());
    }
  }
  const auto& relay = w.value("relay", nlohmann::json());
  if (relay.is_object())
    std::printf("relay: %s, %d worker(s) connected, %llu message(s) dropped\n",
                relay.value("endpoint", std::string()).c_str(), relay.value("connected", 0),
                static_cast<unsigned long long>(relay.value("dropped", uint64_t(0))));
  const auto& stalls = w.value("stalls", nlohmann::json::array());
  if (!stalls.empty()) {
    std::printf("\nstalled links\n");
    for (const auto& st : stalls)
      if (st.is_string()) std::printf("  %s\n", st.get<std::string>().c_str());
  }
  const auto refused = w.value("refused_connections", uint64_t(0)), rejected = w.value("rejected", uint64_t(0));
  if (refused > 0 || rejected > 0)
    std::printf("\ncontrol plane: %llu connection(s) refused (no job secret), %llu message(s) rejected\n",
                static_cast<unsigned long long>(refused), static_cast<unsigned long long>(rejected));
}

// What the workers acknowledged: which ranks scheduled the change and from which step, or a note (a rollback).
void print_acknowledgement(const nlohmann::json& j) {
  if (j.contains("applied") && j["applied"].is_array()) {
    std::map<int64_t, std::string> by_step;
    for (const auto& a : j["applied"]) {
      std::string& ranks = by_step[a.value("from_step", int64_t(-1))];
      ranks += (ranks.empty() ? "" : ",") + std::to_string(a.value("rank", -1));
    }
    for (const auto& [step, ranks] : by_step)
      std::printf("  acknowledged by rank(s) %s: applies from step %lld\n", ranks.c_str(),
                  static_cast<long long>(step));
  }
  if (j.contains("note") && j["note"].is_string()) std::printf("  %s\n", j["note"].get<std::string>().c_str());
}

// ctl set-codec: a pipeline link's codec one way, the replicas' gradients (--role grad), or the tp sums (--role tp).
void run_set_codec(CtlFlags& f) {
  f.spec = compress::expand_preset(f.spec);
  if (!f.role.empty() && f.role != "act" && f.role != "act_grad" && f.role != "grad" && f.role != "tp")
    fail("--role '" + f.role + "': choose act, act_grad, grad or tp", 2);
  if (f.role == "tp") {
    if (!f.dir.empty()) fail("--role tp: a tp group's all-reduce uses one codec both ways; drop --dir", 2);
    if (!f.link.empty()) fail("--role tp: every tp group's sums switch together; drop --link", 2);
    auto j = request(f, "set-codec", nlohmann::json{{"role", "tp"}, {"spec", f.spec}}.dump());
    if (f.json)
      std::printf("%s\n", j.dump().c_str());
    else
      std::printf("partial sums of the tp shards switch to %s from step %lld\n", j.value("spec", std::string()).c_str(),
                  static_cast<long long>(j.value("from_step", int64_t(0))));
    if (!f.json) print_acknowledgement(j);
    return;
  }
  if (f.role == "grad") {
    if (!f.dir.empty()) fail("--role grad: a replica group's all-reduce uses one codec both ways; drop --dir", 2);
    nlohmann::json args{{"role", "grad"}, {"spec", f.spec}};
    if (!f.link.empty()) args["link"] = f.link;
    auto j = request(f, "set-codec", args.dump());
    if (f.json)
      std::printf("%s\n", j.dump().c_str());
    else
      std::printf("gradients of %s switch to %s from step %lld\n", j.value("link", std::string()).c_str(),
                  j.value("spec", std::string()).c_str(), static_cast<long long>(j.value("from_step", int64_t(0))));
    if (!f.json) print_acknowledgement(j);
    return;
  }
  const std::string role_dir = f.role == "act" ? "fwd" : f.role == "act_grad" ? "bwd" : "";
  if (f.dir.empty()) f.dir = role_dir;
  if (f.dir != "fwd" && f.dir != "bwd") fail("--dir '" + f.dir + "': choose fwd or bwd", 2);
  if (!role_dir.empty() && role_dir != f.dir)
    fail("--role " + f.role + " travels " + role_dir + ", not --dir " + f.dir, 2);
  if (f.link.empty()) fail("set-codec: give --link A-B (or --role grad)", 2);
  auto j = request(f, "set-codec", nlohmann::json{{"link", f.link}, {"dir", f.dir}, {"spec", f.spec}}.dump());
  if (f.json)
    std::printf("%s\n", j.dump().c_str());
  else
    std::printf("link %s %s switches to %s from step %lld\n", j.value("link", std::string()).c_str(),
                j.value("dir", std::string()).c_str(), j.value("spec", std::string()).c_str(),
                static_cast<long long>(j.value("from_step", int64_t(0))));
  if (!f.json) print_acknowledgement(j);
}

// ctl page-url: the live page's address with its token.
void run_page_url(const CtlFlags& f) {
  auto j = request(f, "status", "");
  std::string url = j.value("http", std::string());
  if (url.empty()) fail("page-url: the job serves no page: start its coordinator (or launch) with --http ADDR:PORT", 1);
  // A coordinator bound to every interface names 127.0.0.1: name the host this ctl reached instead.
  const std::string wildcard = "http://127.0.0.1:";
  auto at = parse_tcp_endpoint(f.coordinator);
  if (url.rfind(wildcard, 0) == 0 && at.ok() && at->host != "127.0.0.1" && at->host != "localhost" &&
      j.value("http_bind", std::string()) == "0.0.0.0")
    url = "http://" + at->host + ":" + url.substr(wildcard.size());
  const JobSecret secret = required_secret(f.secret, "ctl");
  if (f.json)
    std::printf("%s\n", nlohmann::json{{"url", url}, {"token", secret.page_token()}}.dump().c_str());
  else
    std::printf("%s#token=%s\n", url.c_str(), secret.page_token().c_str());
}

RegisterCommand reg("", 50, [](CLI::App& app) {
  auto f = std::make_shared<CtlFlags>();
  auto* cmd = app.add_subcommand("ctl", "query or steer a running job through its coordinator");
  cmd->add_option("--coordinator", f->coordinator, "the coordinator's tcp://HOST:PORT")->required();
  add_secret_flags(cmd, f->secret);
  cmd->add_option("--timeout", f->timeout_s,
                  "seconds to wait for the reply (set-codec: 600, since it waits for every worker's acknowledgement)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0))
      ->each([f](const std::string&) { f->timeout_given = true; });
  cmd->add_flag("--json", f->json, "print the coordinator's JSON reply as is");
  cmd->require_subcommand(1);

  auto* status =
      cmd->add_subcommand("status", "the plan, each link's codec, bytes and measured bandwidth, the workers");
  status->callback([f] {
    auto j = request(*f, "status", "{}");
    if (f->json)
      std::printf("%s\n", j.dump(2).c_str());
    else
      print_status(j);
  });

  auto* set = cmd->add_subcommand(
      "set-codec",
      "switch a codec at a step boundary on both ends: one pipeline link, the replicas' gradients, or the tp sums");
  set->add_option("--link", f->link,
                  "the pipeline link A-B (stages, e.g. 1-2); with --role grad, replica links (s1d0-s1d1, d0-d1): "
                  "their stages' groups (default: every group)");
  set->add_option("--dir", f->dir, "fwd (activations) or bwd (activation gradients)");
  set->add_option("--role", f->role,
                  "act, act_grad (same as --dir fwd/bwd), grad: the weight gradients between replicas, or tp: the "
                  "tensor shards' partial sums");
  set->add_option("spec", f->spec, "codec spec, e.g. int4, lowrank:rank=8+int8, powersgd:rank=4 (grad)")->required();
  set->callback([f] { run_set_codec(*f); });

  auto* link = cmd->add_subcommand(
      "set-link",
      "reshape the job's emulated links now (a job started with --link): RATE[,DELAY] for every link, or "
      "LINK[:DIR]=RATE[,DELAY]");
  link->add_option("rule", f->spec, "e.g. 5M,80ms or 0-1=5M,80ms or 1-2:bwd=100M,5ms")->required();
  link->callback([f] {
    auto r = parse_link_rule(f->spec);
    if (!r.ok()) fail(r.status().message(), 2);
    auto j = request(*f, "set-link", nlohmann::json{{"rule", f->spec}}.dump());
    if (f->json)
      std::printf("%s\n", j.dump().c_str());
    else
      std::printf("links reshaped: %s (the job's rules now: %s)\n", f->spec.c_str(),
                  describe_link_rules(j.value("links", std::vector<std::string>())).c_str());
  });

  auto* page = cmd->add_subcommand(
      "page-url",
      "print the address of the job's live page with its token (after #: a browser never sends it; the token reads "
      "the page and /metrics, nothing else)");
  page->callback([f] { run_page_url(*f); });
});

}  // namespace
}  // namespace lh::app
