// HttpServer: routes, the token beyond loopback, 404/405, the cache, and hostile clients (slowloris, huge headers,
// thousands of connections) costing a bounded number of threads and descriptors.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/http_client.h"
#include "web/http_server.h"
#include "web/page.h"

namespace lh {
namespace {

using namespace std::chrono_literals;

HttpServerOptions at(const std::string& listen, const std::string& token = "") {
  HttpServerOptions o;
  o.listen = listen;
  o.token = token;
  return o;
}

size_t open_fds() {
  return dir_entries("/proc/self/fd");
}
size_t threads() {
  return dir_entries("/proc/self/task");
}

std::map<std::string, HttpRoute> routes(std::atomic<int>* calls = nullptr) {
  std::map<std::string, HttpRoute> r;
  r["/"] = {[] { return HttpResponse{200, "text/html", "<html>page</html>"}; }, false, 0};
  r["/data"] = {[calls] {
                  if (calls) ++*calls;
                  return HttpResponse{200, "application/json", "{\"ok\":true}"};
                },
                true, 0};
  r["/cached"] = {[calls] {
                    if (calls) ++*calls;
                    return HttpResponse{200, "text/plain", "cached"};
                  },
                  true, 60.0};
  return r;
}

TEST(HttpServer, ServesRoutesAndNamesWhatIsWrong) {
  auto s = HttpServer::start(at("127.0.0.1:0"), routes());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const int port = (*s)->port();
  EXPECT_GT(port, 0);
  EXPECT_EQ((*s)->url(), "http://127.0.0.1:" + std::to_string(port) + "/");
  std::string r = http_get(port, "/");
  EXPECT_EQ(status_of(r), 200) << r;
  EXPECT_NE(r.find("<html>page</html>"), std::string::npos);
  EXPECT_NE(r.find("Content-Type: text/html"), std::string::npos);
  EXPECT_EQ(r.find("Access-Control-Allow-Origin"), std::string::npos) << "no CORS: " << r;
  EXPECT_EQ(status_of(http_get(port, "/data")), 200);  // loopback: no token needed
  r = http_get(port, "/nope");
  EXPECT_EQ(status_of(r), 404);
  EXPECT_NE(r.find("no such page"), std::string::npos);
  r = http_exchange(port, "POST /data HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(status_of(r), 405) << r;
  r = http_exchange(port, "HEAD /data HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(status_of(r), 200);
  EXPECT_EQ(r.find("{\"ok\""), std::string::npos) << "HEAD has no body";
  EXPECT_EQ((*s)->not_found(), 1u);
  // DNS rebinding: another site's name pointed at 127.0.0.1 is refused on loopback.
  r = http_exchange(port, "GET /data HTTP/1.1\r\nHost: evil.example:" + std::to_string(port) + "\r\n\r\n");
  EXPECT_EQ(status_of(r), 403) << r;
  EXPECT_EQ(status_of(http_exchange(port, "GET /data HTTP/1.1\r\nHost: localhost:1\r\n\r\n")), 200);
}

TEST(HttpServer, BadAddressesAreNamed) {
  auto bad = [](const std::string& listen, const std::string& token = "") {
    auto s = HttpServer::start(at(listen, token), routes());
    return s.ok() ? std::string("started") : s.status().message();
  };
  EXPECT_NE(bad("[::1]:8080").find("IPv6 is not supported"), std::string::npos);
  EXPECT_NE(bad("example.org:8080").find("'example.org' is not an IPv4 address"), std::string::npos);
  EXPECT_NE(bad("127.0.0.1:http").find("the port 'http' is not a number"), std::string::npos);
  EXPECT_NE(bad("127.0.0.1:70000").find("not a number in 0..65535"), std::string::npos);
  EXPECT_NE(bad("0.0.0.0:0").find("needs the job's page token"), std::string::npos);
  auto first = HttpServer::start(at("127.0.0.1:0"), routes());
  ASSERT_TRUE(first.ok());
  EXPECT_NE(bad("127.0.0.1:" + std::to_string((*first)->port())).find("cannot listen"), std::string::npos);
  auto a = parse_http_address(":9000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_TRUE(a->loopback());
  EXPECT_EQ(parse_http_address("localhost:1")->host, "127.0.0.1");
  EXPECT_FALSE(parse_http_address("0.0.0.0:1")->loopback());
}

TEST(HttpServer, BeyondLoopbackDataNeedsTheToken) {
  auto s = HttpServer::start(at("0.0.0.0:0", "s3cret-token"), routes());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const int port = (*s)->port();
  EXPECT_TRUE((*s)->needs_token());
  EXPECT_EQ(status_of(http_get(port, "/")), 200) << "the page itself carries no data";
  std::string r = http_get(port, "/data");
  EXPECT_EQ(status_of(r), 401);
  EXPECT_NE(r.find("page-url"), std::string::npos);
  EXPECT_EQ(status_of(http_get(port, "/data", "Authorization: Bearer wrong-token\r\n")), 401);
  EXPECT_EQ(status_of(http_get(port, "/data?token=s3cret-token")), 401) << "a token in the URL's query is not taken";
  EXPECT_EQ(status_of(http_get(port, "/data", "Authorization: Bearer s3cret-token\r\n")), 200);
  EXPECT_EQ((*s)->unauthorized(), 3u);
}

TEST(HttpServer, ACachedRouteIsComputedOncePerPeriod) {
  std::atomic<int> calls{0};
  auto s = HttpServer::start(at("127.0.0.1:0"), routes(&calls));
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(status_of(http_get((*s)->port(), "/cached")), 200);
  EXPECT_EQ(calls.load(), 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(status_of(http_get((*s)->port(), "/data")), 200);
  EXPECT_EQ(calls.load(), 4);
}

TEST(HttpServer, HugeHeadersAreRefused) {
  auto s = HttpServer::start(at("127.0.0.1:0"), routes());
  ASSERT_TRUE(s.ok());
  const std::string huge = "X-Filler: " + std::string(64 * 1024, 'a') + "\r\n";
  const std::string r = http_get((*s)->port(), "/data", huge);
  EXPECT_NE(status_of(r), 200) << "a 64 KiB header must not be served";
  EXPECT_EQ(status_of(http_get((*s)->port(), "/data")), 200) << "and the server goes on";
}

// Slowloris: connections that trickle a request's headers and never finish them, more than the server's threads.
// They are cut at the request timeout, an honest client is served once one is, and threads stay bounded.
TEST(HttpServer, SlowClientsAreCutAndThreadsStayBounded) {
  HttpServerOptions o = at("127.0.0.1:0");
  o.request_timeout_ms = 1000;
  auto s = HttpServer::start(o, routes());
  ASSERT_TRUE(s.ok());
  const int port = (*s)->port();
  const size_t threads_before = threads();
  std::vector<int> slow;
  for (int i = 0; i < 32; ++i) {
    const int fd = connect_to(port);
    ASSERT_GE(fd, 0);
    (void)!::write(fd, "GET /data HTTP/1.1\r\n", 20);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop) {
      for (int fd : slow) (void)!::send(fd, "X-a: b\r\n", 8, MSG_NOSIGNAL);
      std::this_thread::sleep_for(200ms);
    }
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_LE(threads(), threads_before + 1) << "the server's threads are fixed at start (+1: the trickler)";
  const auto t0 = std::chrono::steady_clock::now();
  std::string r;
  while (status_of(r) != 200 && std::chrono::steady_clock::now() - t0 < 20s) r = http_get(port, "/data");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(status_of(r), 200) << "an honest client was never served beside 32 slow ones";
  std::printf("honest client served after %.2f s beside 32 slowloris connections\n", waited);
  stop = true;
  trickle.join();
  // Every slow connection was closed by the server (a read sees the end, or a reset).
  int closed = 0;
  for (int fd : slow) {
    pollfd p{fd, POLLIN, 0};
    char buf[512];
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < end) {
      if (::poll(&p, 1, 100) > 0) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) {
          ++closed;
          break;
        }
      }
    }
    ::close(fd);
  }
  EXPECT_EQ(closed, 32);
}

// Thousands of idle connections: the server accepts only a bounded number (its threads and queue); the rest wait in
// the kernel, so its descriptors stay bounded, and once they go an honest client is served.
TEST(HttpServer, ThousandsOfConnectionsCostBoundedDescriptors) {
  HttpServerOptions o = at("127.0.0.1:0");
  o.request_timeout_ms = 1000;
  auto s = HttpServer::start(o, routes());
  ASSERT_TRUE(s.ok());
  const int port = (*s)->port();
  const size_t fds_before = open_fds();
  std::vector<int> conns;
  for (int i = 0; i < 2000; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    (void)::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));  // in progress or refused: either is fine
    conns.push_back(fd);
  }
  std::this_thread::sleep_for(500ms);
  // Ours are 2000; the server's are its threads' and queue's (4 + 16) at most, plus its listener.
  const size_t server_fds = open_fds() - fds_before - conns.size();
  EXPECT_LE(server_fds, size_t(4 + 16 + 2)) << "descriptors the server holds beside 2000 idle connections";
  std::printf("the server held %zu descriptors beside 2000 idle connections\n", server_fds);
  for (int fd : conns) ::close(fd);
  std::string r;
  const auto t0 = std::chrono::steady_clock::now();
  while (status_of(r) != 200 && std::chrono::steady_clock::now() - t0 < 30s) r = http_get(port, "/data");
  EXPECT_EQ(status_of(r), 200);
}

TEST(Page, TheReportCarriesItsDataSafely) {
  std::string live = live_page_html();
  EXPECT_NE(live.find("<!--LH-DATA-->"), std::string::npos);
  for (size_t at; (at = live.find("http://www.w3.org/2000/svg")) != std::string::npos;) live.erase(at, 26);  // a name
  EXPECT_EQ(live.find("http://"), std::string::npos) << "the page fetches nothing from outside";
  EXPECT_EQ(live.find("https://"), std::string::npos);
  const std::string page = report_page_html({{"title", "</script><script>alert(1)</script>"}});
  EXPECT_EQ(page.find("<!--LH-DATA-->"), std::string::npos);
  EXPECT_NE(page.find("<script id=\"lh-data\" type=\"application/json\">"), std::string::npos);
  EXPECT_EQ(page.find("</script><script>alert(1)"), std::string::npos) << "a '</' in the data would end the script";
  EXPECT_NE(page.find("<\\/script><script>alert(1)<\\/script>"), std::string::npos);
}

}  // namespace
}  // namespace lh
