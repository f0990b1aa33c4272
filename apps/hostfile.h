// defines: `launch --hosts FILE`'s hostfile (one host per line: HOST [slots=N] [site=NAME] [advertise=ADDR], as
// DeepSpeed's and pdsh's) and the ssh command line that starts one worker there. Used by apps/cmd_launch.cpp.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace lh::app {

// One worker's place: the host it runs on, its site and the address its peers reach it at (both optional).
struct HostSlot {
  std::string host;
  std::string site;
  std::string advertise;
  int line = 0;  // where the hostfile names it
};

// One entry per slot, each site's slots together (sites in the order they first appear; a host's slots in a row), so
// that consecutive ranks, which are pipeline neighbours, share a site. Errors name the file, the line and the field.
Result<std::vector<HostSlot>> parse_hostfile(const std::string& text, const std::string& source);
Result<std::vector<HostSlot>> read_hostfile(const std::string& path);

// True for names of this machine's loopback (localhost, 127.x.x.x, ::1).
bool loopback_host(const std::string& host);

// `argv` as one line a POSIX shell reads back into the same words (what ssh hands the remote shell).
std::string shell_command(const std::vector<std::string>& argv);

// --ssh "ssh -F cfg -p 2222": the words of the ssh command (split at spaces; no quoting inside).
Result<std::vector<std::string>> ssh_words(const std::string& ssh);

}  // namespace lh::app
