// A bare HTTP/1.1 client for tests (a socket, one request, the answer until the server closes), and headless
// Chromium (Debian's `chromium`) to run the live page's script: --dump-dom for what it drew, --screenshot for the
// note. Used by tests/web and the job tests of the live page.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>

#include "tests/common/run_command.h"

namespace lh {

inline int connect_to(int port, const std::string& host = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` and reads the whole answer (the server closes every connection), within `timeout`.
inline std::string http_exchange(int port, const std::string& request,
                                 std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  const int fd = connect_to(port);
  if (fd < 0) return "";
  (void)!::write(fd, request.data(), request.size());
  std::string out;
  const auto end = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

inline std::string http_get(int port, const std::string& path, const std::string& headers = "") {
  return http_exchange(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + "\r\n");
}

inline int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

inline std::string body_of(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// Entries of a folder (of /proc/PID/fd: open descriptors; of /proc/PID/task: threads), "." and ".." included.
inline size_t dir_entries(const std::string& dir) {
  size_t n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

// A shell command's stdout and stderr, and its exit code.
inline std::string run_capture(const std::string& command, int* code = nullptr) {
  testing::CommandRun r = testing::run_command(command);
  if (code && r.code != -1) *code = r.code;
  return r.output;
}

inline bool have_command(const std::string& name) {
  int code = 1;
  run_capture("command -v " + name + " >/dev/null", &code);
  return code == 0;
}

// Whether `dom` is a page Chromium dumped (it starts but fails in some roots: no /dev/shm, a missing library).
inline bool chromium_ran(const std::string& dom) {
  return dom.find("<html") != std::string::npos;
}

// Headless Chromium's DOM of `url` once its scripts ran for `budget_ms` of virtual time (fetches pause that clock).
inline std::string chromium_dom(const std::string& url, int budget_ms = 3000) {
  return run_capture(
      "timeout 60 chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage "
      "--virtual-time-budget=" +
      std::to_string(budget_ms) + " --dump-dom '" + url + "' 2>/dev/null");
}

inline bool chromium_screenshot(const std::string& url, const std::string& png, int budget_ms = 3000) {
  int code = 1;
  run_capture(
      "timeout 60 chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage "
      "--virtual-time-budget=" +
          std::to_string(budget_ms) + " --window-size=1280,1300 --screenshot='" + png + "' '" + url +
          "' >/dev/null 2>&1",
      &code);
  return code == 0;
}

// An attribute of the first element of the dumped DOM whose tag carries `marker` (e.g. id="lh-loss").
inline std::string dom_attribute(const std::string& dom, const std::string& marker, const std::string& attribute) {
  const size_t at = dom.find(marker);
  if (at == std::string::npos) return "";
  const size_t open = dom.rfind('<', at), close = dom.find('>', at);
  const std::string tag = dom.substr(open, close - open);
  std::smatch m;
  if (std::regex_search(tag, m, std::regex(attribute + "=\"([^\"]*)\""))) return m[1];
  return "";
}

}  // namespace lh
