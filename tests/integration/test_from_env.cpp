// `worker --from-env`: a worker's rank, the job's size and the coordinator's address from Slurm's, torchrun's or a
// Kubernetes Indexed Job's variables, each missing or conflicting variable named; and a job started the way
// torchrun starts one (every worker with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; rank 0 with
// --start-coordinator) reproducing `launch`'s losses. Label `integration`.
#include <sys/stat.h>

#include <cmath>

#include "tests/common/http_client.h"
#include "tests/integration/launch_util.h"
#include "web/http_server.h"

namespace lh {
namespace {

// Every variable --from-env reads, unset, so the test's own environment cannot leak in.
std::map<std::string, std::string> clean_env(std::map<std::string, std::string> set) {
  std::map<std::string, std::string> env;
  for (const char* v : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "RANK", "WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "JOB_COMPLETION_INDEX", "LH_WORLD_SIZE", "LH_SERVICE", "LH_COORDINATOR",
                        "LH_COORDINATOR_PORT", "LH_ENGINE", "LH_SITE"})
    env[v] = "";
  for (auto& [k, v] : set) env[k] = v;
  return env;
}

BinRun run_env(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
  static int n = 0;
  const std::string out = temp_path("from_env_" + std::to_string(n++) + ".txt");
  const int code = wait_exit(spawn_env(args, out, env), std::chrono::seconds(60));
  return {code, slurp(out)};
}

// `worker --from-env --show-place` under `env`.
BinRun place(const std::map<std::string, std::string>& env, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"worker", "--from-env", "--show-place"};
  args.insert(args.end(), more.begin(), more.end());
  return run_env(args, clean_env(env));
}

class FromEnv : public Launch {};

TEST_F(FromEnv, EachLaunchersVariablesGiveThePlace) {
  BinRun t = place({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}});
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("rank 2 of 4 (torchrun: "), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("coordinator tcp://10.1.2.3:29501"), std::string::npos) << "MASTER_PORT + 1: " << t.output;
  t = place({{"RANK", "0"},
             {"WORLD_SIZE", "2"},
             {"MASTER_ADDR", "10.1.2.3"},
             {"MASTER_PORT", "29500"},
             {"LH_COORDINATOR_PORT", "7000"}});
  EXPECT_NE(t.output.find("coordinator tcp://10.1.2.3:7000"), std::string::npos) << t.output;

  // Slurm: the first host of the node list, expanded by scontrol (a stand-in here, on PATH first).
  const std::string bin_dir = temp_path("fake_slurm");
  std::filesystem::create_directories(bin_dir);
  std::ofstream(bin_dir + "/scontrol") << "#!/bin/sh\n[ \"$1 $2\" = \"show hostnames\" ] || exit 2\n"
                                          "echo node07\necho node08\necho node09\n";
  ::chmod((bin_dir + "/scontrol").c_str(), 0755);
  const std::string path = bin_dir + ":" + std::getenv("PATH");
  BinRun s =
      place({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "3"}, {"SLURM_JOB_NODELIST", "node[07-09]"}, {"PATH", path}});
  ASSERT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find("rank 1 of 3 (slurm: SLURM_PROCID=1, SLURM_NTASKS=3, SLURM_JOB_NODELIST=node[07-09])"),
            std::string::npos)
      << s.output;
  EXPECT_NE(s.output.find("coordinator tcp://node07:5555"), std::string::npos) << s.output;
  // Under srun torchrun both are set; when they agree on the rank, torchrun (the inner launcher) is followed.
  s = place({{"SLURM_PROCID", "1"},
             {"SLURM_NTASKS", "3"},
             {"RANK", "1"},
             {"WORLD_SIZE", "3"},
             {"MASTER_ADDR", "h"},
             {"MASTER_PORT", "100"},
             {"PATH", path}});
  EXPECT_NE(s.output.find("(torchrun: "), std::string::npos) << s.output;

  BinRun k = place({{"JOB_COMPLETION_INDEX", "3"}, {"LH_WORLD_SIZE", "8"}, {"LH_SERVICE", "lh-coordinator"}});
  ASSERT_EQ(k.code, 0) << k.output;
  EXPECT_NE(k.output.find("rank 3 of 8 (kubernetes: "), std::string::npos) << k.output;
  EXPECT_NE(k.output.find("coordinator tcp://lh-coordinator:5555"), std::string::npos) << k.output;
  // --coordinator and LH_COORDINATOR name the coordinator; the environment then gives only the place.
  k = place({{"JOB_COMPLETION_INDEX", "0"}, {"LH_WORLD_SIZE", "2"}, {"LH_COORDINATOR", "tcp://c.example:6000"}});
  EXPECT_NE(k.output.find("coordinator tcp://c.example:6000"), std::string::npos) << k.output;
  k = place({{"JOB_COMPLETION_INDEX", "0"}, {"LH_WORLD_SIZE", "2"}}, {"--coordinator", "tcp://given:1"});
  EXPECT_NE(k.output.find("coordinator tcp://given:1"), std::string::npos) << k.output;
  std::filesystem::remove_all(bin_dir);
}

TEST_F(FromEnv, MissingAndConflictingVariablesAreNamed) {
  struct Case {
    std::map<std::string, std::string> env;
    std::string says;
  } cases[] = {
      {{}, "none of SLURM_PROCID (Slurm), RANK and WORLD_SIZE (torchrun) or JOB_COMPLETION_INDEX"},
      {{{"RANK", "1"}}, "RANK is set but WORLD_SIZE is not: torchrun sets both"},
      {{{"WORLD_SIZE", "2"}}, "WORLD_SIZE is set but RANK is not"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "two"}, {"MASTER_ADDR", "h"}}, "WORLD_SIZE='two' is not a whole number"},
      {{{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}},
       "rank 4 (RANK) is not below the job's size 4 (WORLD_SIZE)"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}, "RANK is set but MASTER_ADDR is not"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, "no coordinator port: set LH_COORDINATOR_PORT"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}},
       "MASTER_PORT=70000 is out of range"},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}},
       "RANK=0 but SLURM_PROCID=1: the environment names two places"},
      {{{"SLURM_PROCID", "0"}}, "SLURM_PROCID is set but SLURM_NTASKS is not"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, "SLURM_PROCID is set but SLURM_JOB_NODELIST is not"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[1-2]"}, {"PATH", "/nonexistent"}},
       "SLURM_JOB_NODELIST='n[1-2]': `scontrol show hostnames` failed"},
      {{{"JOB_COMPLETION_INDEX", "0"}}, "JOB_COMPLETION_INDEX is set but LH_WORLD_SIZE is not"},
      {{{"JOB_COMPLETION_INDEX", "0"}, {"LH_WORLD_SIZE", "2"}}, "neither LH_SERVICE"},
      {{{"LH_ENGINE", "mpi"}, {"RANK", "0"}}, "LH_ENGINE='mpi': expected slurm, torchrun or kubernetes"},
      {{{"JOB_COMPLETION_INDEX", "0"}, {"LH_WORLD_SIZE", "2"}, {"LH_COORDINATOR", "c:1"}},
       "the coordinator 'c:1' is not tcp://HOST:PORT (LH_COORDINATOR)"},
  };
  for (const Case& c : cases) {
    BinRun r = place(c.env);
    EXPECT_EQ(r.code, 2) << c.says << ": " << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
  }
  BinRun both =
      place({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}, {"--rank", "0"});
  EXPECT_NE(both.output.find("--rank and --from-env both give this worker's rank"), std::string::npos) << both.output;
  BinRun stray = run_env({"worker", "--coordinator", "tcp://h:1", "--pp", "2"}, clean_env({}));
  EXPECT_NE(stray.code, 0);
  BinRun alone = run_env({"worker", "--start-coordinator", "--coordinator", "tcp://h:1"}, clean_env({}));
  EXPECT_NE(alone.output.find("--start-coordinator needs --from-env"), std::string::npos) << alone.output;
}

// A job started as torchrun starts one: three processes, each told RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT;
// rank 0 starts the coordinator beside its worker. Its losses are `launch`'s for the same job.
TEST_F(FromEnv, ATorchrunStyleJobReproducesLaunch) {
  const int steps = 4;
  const std::string ref = temp_path("from_env_ref.jsonl"), got = temp_path("from_env_job.jsonl");
  ASSERT_NO_FATAL_FAILURE(run_reference_launch(3, steps, ref, {"--pp", "3"}));

  const std::string key = make_key("from_env");
  // A free port for the coordinator (torchrun's store would take the one below it, MASTER_PORT).
  auto free_port = free_tcp_port("127.0.0.1");
  ASSERT_TRUE(free_port.ok()) << free_port.status().to_string();
  const int master_port = *free_port - 1;
  std::vector<std::string> job = {"--pp", "3", "--microbatches", "4", "--metrics", got};
  for (const std::string& m : model_flags(steps)) job.push_back(m);
  std::vector<pid_t> pids;
  std::vector<std::string> outs;
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<std::string> args = {"--threads",  "1",         "--log-level", "warn",       "worker",
                                     "--from-env", "--ucx-tls", "tcp",         "--key-file", key};
    if (rank == 0) {
      args.push_back("--start-coordinator");
      args.push_back("--");
      args.insert(args.end(), job.begin(), job.end());
    }
    outs.push_back(temp_path("from_env_rank" + std::to_string(rank) + ".txt"));
    pids.push_back(spawn_env(args, outs.back(),
                             clean_env({{"RANK", std::to_string(rank)},
                                        {"WORLD_SIZE", "3"},
                                        {"MASTER_ADDR", "127.0.0.1"},
                                        {"MASTER_PORT", std::to_string(master_port)}})));
  }
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_EQ(wait_exit(pids[size_t(rank)], 300s), 0) << "rank " << rank << ":\n" << slurp(outs[size_t(rank)]);
  const std::string rank0 = slurp(outs[0]);
  EXPECT_NE(rank0.find("--from-env: rank 0 of 3 (torchrun: "), std::string::npos) << rank0;
  EXPECT_NE(rank0.find("started the job's coordinator"), std::string::npos) << rank0;
  ASSERT_NO_FATAL_FAILURE(expect_losses_near(losses_of(got), losses_of(ref), steps));
}

// Two Slurm allocations at two sites join one coordinator (--coordinator given): SLURM_PROCID starts at 0 in each, so
// the coordinator assigns the ranks, each site's workers together (--site, or $LH_SITE) and in a site by their
// SLURM_PROCID, whatever order they join in; the job trains as launch's does. A bad site is named.
TEST_F(FromEnv, TwoSlurmAllocationsAtTwoSitesJoinOneCoordinatorSiteBySite) {
  const int steps = 4;
  const std::string ref = temp_path("sites_ref.jsonl"), got = temp_path("sites_job.jsonl");
  ASSERT_NO_FATAL_FAILURE(run_reference_launch(4, steps, ref, {"--pp", "4"}));
  const std::string key = make_key("sites");
  std::vector<std::string> job = {"--log-level", "warn",      "coordinator", "--listen",   "tcp://127.0.0.1:*",
                                  "--workers",   "4",         "--pp",        "4",          "--microbatches",
                                  "4",           "--metrics", got,           "--key-file", key};
  for (const std::string& m : model_flags(steps)) job.push_back(m);
  std::string ep;
  const std::string coordinator_out = temp_path("sites_coordinator.txt");
  const pid_t coordinator = spawn_coordinator(job, coordinator_out, &ep);
  ASSERT_FALSE(ep.empty()) << slurp(coordinator_out);
  // Paris joins first; Oslo sorts first (both sites' lowest SLURM_PROCID is 0, then by name).
  struct Member {
    std::string site;
    int procid;
    int rank;  // the one the coordinator should give
  };
  const std::vector<Member> members = {{"paris", 1, 3}, {"paris", 0, 2}, {"oslo", 1, 1}, {"oslo", 0, 0}};
  std::vector<pid_t> pids;
  std::vector<std::string> outs;
  for (const Member& m : members) {
    std::vector<std::string> args = {"--threads", "1",   "--log-level", "info", "worker",        "--from-env",
                                     "--ucx-tls", "tcp", "--key-file",  key,    "--coordinator", ep};
    std::map<std::string, std::string> env = {{"SLURM_PROCID", std::to_string(m.procid)}, {"SLURM_NTASKS", "2"}};
    if (m.procid == 0)
      env["LH_SITE"] = m.site;
    else
      args.insert(args.end(), {"--site", m.site});
    outs.push_back(temp_path("sites_" + m.site + std::to_string(m.procid) + ".txt"));
    pids.push_back(spawn_env(args, outs.back(), clean_env(env)));
    std::this_thread::sleep_for(300ms);
  }
  for (size_t i = 0; i < members.size(); ++i) {
    EXPECT_EQ(wait_exit(pids[i], 300s), 0) << slurp(outs[i]);
    const std::string said = slurp(outs[i]);
    const std::string want = "rank " + std::to_string(members[i].rank) + " (stage " + std::to_string(members[i].rank);
    EXPECT_NE(said.find(want), std::string::npos) << members[i].site << " " << members[i].procid << ":\n" << said;
  }
  EXPECT_EQ(wait_exit(coordinator, 60s), 0) << slurp(coordinator_out);
  ASSERT_NO_FATAL_FAILURE(expect_losses_near(losses_of(got), losses_of(ref), steps));
  BinRun bad = run_env({"worker", "--coordinator", ep, "--key-file", key, "--site", "a b"}, clean_env({}));
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--site 'a b': a site is up to 64 letters"), std::string::npos) << bad.output;
}

// --start-coordinator with a job flag the coordinator refuses: rank 0 stops at once with the coordinator's error and
// code, instead of waiting for a coordinator that never answers.
TEST_F(FromEnv, ACoordinatorThatFailsEndsItsWorker) {
  const std::string key = make_key("from_env_bad");
  const auto t0 = std::chrono::steady_clock::now();
  BinRun r =
      run_env({"worker", "--from-env", "--key-file", key, "--join-timeout", "300", "--start-coordinator", "--", "--pp",
               "2", "--steps", "-5"},
              clean_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}));
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--steps"), std::string::npos) << "the coordinator's own words: " << r.output;
  EXPECT_NE(r.output.find("exited with code"), std::string::npos) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
}

}  // namespace
}  // namespace lh
