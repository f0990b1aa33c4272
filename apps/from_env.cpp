// A worker's place from its launcher's environment: Slurm, torchrun, Kubernetes Indexed Jobs.
#include "apps/from_env.h"

#include <cstdio>
#include <map>
#include <memory>

namespace lh::app {
namespace {

struct Reader {
  const EnvLookup& env;
  std::vector<std::string>* read;
  bool has(const char* name) const {
    const char* v = env(name);
    return v && *v;
  }
  std::string text(const char* name) const {
    const char* v = env(name);
    if (v && *v) read->push_back(std::string(name) + "=" + v);
    return v ? v : "";
  }
  // An integer in [lo, hi], or an error naming the variable.
  Result<int> number(const char* name, int lo, int hi) const {
    const std::string v = text(name);
    if (v.empty()) return invalid_argument(std::string(name) + " is not set");
    if (v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
      return invalid_argument(std::string(name) + "='" + v + "' is not a whole number");
    const int n = std::stoi(v);
    if (n < lo || n > hi)
      return invalid_argument(std::string(name) + "=" + v + " is out of range (" + std::to_string(lo) + ".." +
                              std::to_string(hi) + ")");
    return n;
  }
};

// "RANK is set but WORLD_SIZE is not: torchrun sets both".
Status require_with(const Reader& r, const char* present, const char* needed, const std::string& who) {
  if (!r.has(needed))
    return invalid_argument(std::string(present) + " is set but " + needed + " is not: " + who + " sets both");
  return Status::Ok();
}

Result<int> port_of(const Reader& r, int fallback, const char* fallback_from) {
  if (r.has("LH_COORDINATOR_PORT")) return r.number("LH_COORDINATOR_PORT", 1, 65535);
  if (fallback <= 0)
    return invalid_argument(std::string("no coordinator port: set LH_COORDINATOR_PORT") +
                            (fallback_from ? std::string(" (or ") + fallback_from + ")" : std::string()));
  return fallback;
}

}  // namespace

std::string EnvPlace::describe() const {
  std::string vars;
  for (const std::string& v : read) vars += (vars.empty() ? "" : ", ") + v;
  return "rank " + std::to_string(rank) + " of " + std::to_string(world) + " (" + engine + ": " + vars +
         "), coordinator " + coordinator;
}

namespace {

// Which launcher placed this process: $LH_ENGINE, else the one whose variables are set (the innermost when several
// agree on the rank).
Result<std::string> detect_engine(const EnvLookup& env, Reader& r) {
  const bool slurm = r.has("SLURM_PROCID"), torchrun = r.has("RANK") || r.has("WORLD_SIZE"),
             kubernetes = r.has("JOB_COMPLETION_INDEX");
  std::string engine = r.has("LH_ENGINE") ? std::string(env("LH_ENGINE")) : "";
  if (!engine.empty() && engine != "slurm" && engine != "torchrun" && engine != "kubernetes")
    return invalid_argument("LH_ENGINE='" + engine + "': expected slurm, torchrun or kubernetes");
  if (engine.empty()) {
    const int found = int(slurm) + int(torchrun) + int(kubernetes);
    if (found == 0)
      return invalid_argument(
          "--from-env: none of SLURM_PROCID (Slurm), RANK and WORLD_SIZE (torchrun) or JOB_COMPLETION_INDEX "
          "(a Kubernetes Indexed Job) is set; start the worker from one of them, or give --rank and --coordinator");
    if (found > 1) {
      // Nested launchers (srun torchrun) set both: they must agree on this process's rank, or LH_ENGINE chooses.
      std::map<std::string, std::string> ranks;
      if (slurm) ranks["SLURM_PROCID"] = env("SLURM_PROCID");
      if (torchrun && r.has("RANK")) ranks["RANK"] = env("RANK");
      if (kubernetes) ranks["JOB_COMPLETION_INDEX"] = env("JOB_COMPLETION_INDEX");
      for (const auto& [name, value] : ranks)
        if (value != ranks.begin()->second)
          return invalid_argument(ranks.begin()->first + "=" + ranks.begin()->second + " but " + name + "=" + value +
                                  ": the environment names two places for this worker; set LH_ENGINE=slurm, "
                                  "torchrun or kubernetes to say which launcher to follow");
    }
    engine = torchrun ? "torchrun" : slurm ? "slurm" : "kubernetes";  // the innermost launcher first
  }
  return engine;
}

}  // namespace

Result<EnvPlace> place_from_env(const EnvLookup& env, const HostlistExpander& expand,
                                const std::string& coordinator_flag) {
  EnvPlace p;
  Reader r{env, &p.read};
  auto detected = detect_engine(env, r);
  if (!detected.ok()) return detected.status();
  const std::string engine = std::move(detected).value();
  p.engine = engine;
  std::string host, rank_var, world_var;
  int port = 0;
  if (engine == "torchrun") {
    if (r.has("RANK")) LH_RETURN_IF_ERROR(require_with(r, "RANK", "WORLD_SIZE", "torchrun"));
    if (r.has("WORLD_SIZE")) LH_RETURN_IF_ERROR(require_with(r, "WORLD_SIZE", "RANK", "torchrun"));
    LH_ASSIGN_OR_RETURN(p.rank, r.number("RANK", 0, 4095));
    LH_ASSIGN_OR_RETURN(p.world, r.number("WORLD_SIZE", 1, 4096));
    rank_var = "RANK";
    world_var = "WORLD_SIZE";
    if (coordinator_flag.empty() && !r.has("LH_COORDINATOR")) {
      if (!r.has("MASTER_ADDR")) return invalid_argument("RANK is set but MASTER_ADDR is not: torchrun sets both");
      host = r.text("MASTER_ADDR");
      int master_port = 0;
      if (r.has("MASTER_PORT")) {
        LH_ASSIGN_OR_RETURN(master_port, r.number("MASTER_PORT", 1, 65534));
        ++master_port;  // MASTER_PORT is torchrun's own store: the coordinator listens one above
      }
      LH_ASSIGN_OR_RETURN(port,
                          port_of(r, master_port, "MASTER_PORT, the coordinator then listens on MASTER_PORT + 1"));
    }
  } else if (engine == "slurm") {
    LH_RETURN_IF_ERROR(require_with(r, "SLURM_PROCID", "SLURM_NTASKS", "Slurm"));
    LH_ASSIGN_OR_RETURN(p.rank, r.number("SLURM_PROCID", 0, 4095));
    LH_ASSIGN_OR_RETURN(p.world, r.number("SLURM_NTASKS", 1, 4096));
    rank_var = "SLURM_PROCID";
    world_var = "SLURM_NTASKS";
    if (coordinator_flag.empty() && !r.has("LH_COORDINATOR")) {
      if (!r.has("SLURM_JOB_NODELIST"))
        return invalid_argument(
            "SLURM_PROCID is set but SLURM_JOB_NODELIST is not: the coordinator runs on the allocation's first "
            "host; or name it with --coordinator or LH_COORDINATOR");
      const std::string list = r.text("SLURM_JOB_NODELIST");
      auto hosts = expand(list);
      if (!hosts.ok()) return Status(hosts.status()).prepend("SLURM_JOB_NODELIST='" + list + "'");
      if (hosts->empty()) return invalid_argument("SLURM_JOB_NODELIST='" + list + "' names no host");
      host = hosts->front();
      LH_ASSIGN_OR_RETURN(port, port_of(r, kDefaultCoordinatorPort, nullptr));
    }
  } else {  // kubernetes
    LH_ASSIGN_OR_RETURN(p.rank, r.number("JOB_COMPLETION_INDEX", 0, 4095));
    if (!r.has("LH_WORLD_SIZE"))
      return invalid_argument(
          "JOB_COMPLETION_INDEX is set but LH_WORLD_SIZE is not: an Indexed Job does not say how many pods it has; "
          "set LH_WORLD_SIZE to its completions in the manifest");
    LH_ASSIGN_OR_RETURN(p.world, r.number("LH_WORLD_SIZE", 1, 4096));
    rank_var = "JOB_COMPLETION_INDEX";
    world_var = "LH_WORLD_SIZE";
    if (coordinator_flag.empty() && !r.has("LH_COORDINATOR")) {
      if (!r.has("LH_SERVICE"))
        return invalid_argument(
            "JOB_COMPLETION_INDEX is set but neither LH_SERVICE (the coordinator's Service name) nor LH_COORDINATOR "
            "is: the worker cannot find its coordinator");
      host = r.text("LH_SERVICE");
      LH_ASSIGN_OR_RETURN(port, port_of(r, kDefaultCoordinatorPort, nullptr));
    }
  }
  if (p.rank >= p.world)
    return invalid_argument("rank " + std::to_string(p.rank) + " (" + rank_var + ") is not below the job's size " +
                            std::to_string(p.world) + " (" + world_var + ")");
  if (!coordinator_flag.empty()) {
    p.coordinator = coordinator_flag;
  } else if (r.has("LH_COORDINATOR")) {
    p.coordinator = r.text("LH_COORDINATOR");
  } else {
    p.coordinator = "tcp://" + host + ":" + std::to_string(port);
  }
  const std::string& c = p.coordinator;
  const size_t colon = c.rfind(':');
  if (c.rfind("tcp://", 0) != 0 || colon <= 6 || colon + 1 >= c.size() ||
      c.find_first_not_of("0123456789", colon + 1) != std::string::npos)
    return invalid_argument("the coordinator '" + c + "' is not tcp://HOST:PORT" +
                            (r.has("LH_COORDINATOR") && coordinator_flag.empty() ? " (LH_COORDINATOR)" : ""));
  p.coordinator_host = c.substr(6, colon - 6);
  p.coordinator_port = std::stoi(c.substr(colon + 1));
  return p;
}

Result<std::vector<std::string>> scontrol_hostnames(const std::string& nodelist) {
  if (nodelist.find_first_of("'\"\\$`;&|<>() \t\n") != std::string::npos)
    return invalid_argument("is not a Slurm node list");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> p(
      ::popen(("scontrol show hostnames '" + nodelist + "' 2>&1").c_str(), "r"), ::pclose);
  if (!p) return unavailable("cannot run scontrol");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, n);
  const int st = ::pclose(p.release());
  if (st != 0)
    return unavailable("`scontrol show hostnames` failed (is Slurm's scontrol on PATH?): " +
                       out.substr(0, out.find('\n')));
  std::vector<std::string> hosts;
  size_t at = 0;
  while (at < out.size()) {
    size_t end = out.find('\n', at);
    if (end == std::string::npos) end = out.size();
    if (end > at) hosts.push_back(out.substr(at, end - at));
    at = end + 1;
  }
  return hosts;
}

}  // namespace lh::app
