// launch --hosts: the hostfile and the remote command line (see hostfile.h).
#include "apps/hostfile.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <sstream>

namespace lh::app {
namespace {

bool valid_host(const std::string& h) {
  if (h.empty() || h.size() > 253 || h[0] == '-') return false;
  for (char c : h)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':' || c == '@'))
      return false;
  return true;
}

}  // namespace

Result<std::vector<HostSlot>> parse_hostfile(const std::string& text, const std::string& source) {
  std::vector<std::pair<HostSlot, int>> hosts;  // each host line and its slots
  std::istringstream in(text);
  std::string line;
  int n = 0;
  for (; std::getline(in, line);) {
    ++n;
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string host;
    if (!(words >> host)) continue;
    const std::string at = source + " line " + std::to_string(n);
    if (!valid_host(host))
      return invalid_argument(at + ": '" + host + "' is not a host name or address (letters, digits, '.', '-', '_', ':'"
                              ", and user@ before it)");
    HostSlot slot;
    slot.host = host;
    slot.line = n;
    int slots = 1;
    bool seen_slots = false;
    for (std::string word; words >> word;) {
      const size_t eq = word.find('=');
      const std::string key = word.substr(0, eq), value = eq == std::string::npos ? "" : word.substr(eq + 1);
      if (eq == std::string::npos || value.empty())
        return invalid_argument(at + ": '" + word + "': expected slots=N, site=NAME or advertise=ADDR");
      if (key == "slots") {
        size_t used = 0;
        long v = -1;
        try {
          v = std::stol(value, &used);
        } catch (...) {
          used = 0;
        }
        if (used != value.size() || v < 1 || v > 4096)
          return invalid_argument(at + ": slots '" + value + "' is not a number of workers from 1 to 4096");
        if (seen_slots) return invalid_argument(at + ": slots is given twice");
        seen_slots = true;
        slots = int(v);
      } else if (key == "site") {
        if (!slot.site.empty()) return invalid_argument(at + ": site is given twice");
        slot.site = value;
      } else if (key == "advertise") {
        if (!valid_host(value) || value.find('@') != std::string::npos)
          return invalid_argument(at + ": advertise '" + value + "' is not a host name or address");
        if (!slot.advertise.empty()) return invalid_argument(at + ": advertise is given twice");
        slot.advertise = value;
      } else {
        return invalid_argument(at + ": unknown field '" + key + "' (expected slots, site or advertise)");
      }
    }
    hosts.emplace_back(slot, slots);
  }
  if (hosts.empty()) return invalid_argument(source + ": no hosts (one per line: HOST [slots=N] [site=NAME])");
  std::vector<std::string> sites;
  for (const auto& [h, slots] : hosts)
    if (std::find(sites.begin(), sites.end(), h.site) == sites.end()) sites.push_back(h.site);
  std::vector<HostSlot> out;
  for (const std::string& site : sites)
    for (const auto& [h, slots] : hosts)
      if (h.site == site) out.insert(out.end(), size_t(slots), h);
  return out;
}

Result<std::vector<HostSlot>> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("--hosts '" + path + "': cannot read it");
  std::stringstream text;
  text << in.rdbuf();
  return parse_hostfile(text.str(), "--hosts '" + path + "'");
}

bool loopback_host(const std::string& host) {
  std::string h = host.substr(host.find('@') == std::string::npos ? 0 : host.find('@') + 1);
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}

std::string shell_command(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    out += '\'';
    for (char c : a) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

Result<std::vector<std::string>> ssh_words(const std::string& ssh) {
  std::vector<std::string> words;
  std::istringstream in(ssh);
  for (std::string w; in >> w;) {
    if (w.find_first_of("'\"\\") != std::string::npos)
      return invalid_argument("--ssh '" + ssh + "': no quotes or backslashes (words are split at spaces); put "
                              "options with spaces in an ssh config file (-F FILE)");
    words.push_back(w);
  }
  if (words.empty()) return invalid_argument("--ssh '': give the ssh command, e.g. ssh or 'ssh -F ~/.ssh/lh_config'");
  return words;
}

}  // namespace lh::app
