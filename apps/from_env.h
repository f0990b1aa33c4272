// defines: a worker's place in a job from the environment its launcher set (`worker --from-env`): Slurm
// (SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NODELIST), torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or a
// Kubernetes Indexed Job (JOB_COMPLETION_INDEX, LH_WORLD_SIZE, LH_SERVICE); longhaul's own LH_COORDINATOR,
// LH_COORDINATOR_PORT and LH_ENGINE override. Used by apps/cmd_worker.cpp.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace lh::app {

struct EnvPlace {
  std::string engine;       // slurm, torchrun, kubernetes
  int rank = -1;            // this process's index in the job (0-based)
  int world = 0;            // the job's processes
  std::string coordinator;  // tcp://HOST:PORT
  std::string coordinator_host;
  int coordinator_port = 0;
  std::vector<std::string> read;  // the variables it came from, "NAME=value", for the worker's first line
  std::string describe() const;   // "rank 2 of 4 (torchrun: RANK=2, WORLD_SIZE=4, …), coordinator tcp://…"
};

// A variable's value, or nullptr when unset (std::getenv in the binary; a map in tests).
using EnvLookup = std::function<const char*(const char*)>;
// The hosts of a Slurm node list ("node[01-03],gpu7"): `scontrol show hostnames LIST` in the binary.
using HostlistExpander = std::function<Result<std::vector<std::string>>(const std::string&)>;

// The default port of a coordinator found from the environment when nothing names one: `coordinator`'s --listen.
inline constexpr int kDefaultCoordinatorPort = 5555;

// Reads the engine's variables. `coordinator_flag` (worker --coordinator), when given, names the coordinator and
// the environment only the rank and size. Errors name the variable: missing ("RANK is set but WORLD_SIZE is not"),
// not a number, out of range, or two engines that disagree on the rank (LH_ENGINE=slurm|torchrun|kubernetes
// picks one).
Result<EnvPlace> place_from_env(const EnvLookup& env, const HostlistExpander& expand,
                                const std::string& coordinator_flag);

// `scontrol show hostnames LIST` (errors name scontrol and what it said).
Result<std::vector<std::string>> scontrol_hostnames(const std::string& nodelist);

}  // namespace lh::app
