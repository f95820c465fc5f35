// Container admission latency as a compiled kubelet-like client measures it: per admission,
// GetPreferredAllocation + Allocate for gpu-mem and for gpu-core.percentage (4 RPCs) over the plugin sockets.
//
// It drives the same workload as bench/admission.py: the same random generator (Python's MT19937, seeded the
// same way), the same draws in the same order, so with the same seed both clients ask for the same containers.
//
// Usage: admission_client --mem-socket PATH --core-socket PATH [--seed N] [--admissions N] [--warmup N]
// Prints one line: admissions=N refused=N p50_ms=X p99_ms=X max_ms=X, then per-call medians that say where the
// time goes: gpa_p50_ms, allocate_p50_ms (one RPC each, both resources) and empty_rpc_p50_ms (GetDevicePluginOptions,
// the transport and server floor), and warmup=, mem_ids=, core_ids=.
//
// With --driven the workload comes from standard input instead, one command a line, for a driver that must act
// between admissions (bench/admission.py adds each pod to the fake apiserver first); each answer is one line:
//   admit ID mem=N core=N   (resources in the order to call them; one may be left out)
//                           -> ok ID total_ms=X gpa_ms=X allocate_ms=X    or    refused ID <the plugin's message>
//   release ID              -> released ID   (its device IDs are offered as available again)
// It first prints: ready empty_rpc_p50_ms=X mem_ids=N core_ids=N.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <unordered_set>
#include <vector>

#include "deviceplugin/v1beta1/api.grpc.pb.h"

namespace {

using v1beta1::DevicePlugin;

constexpr int kMem = 0;   // aliyun.com/gpu-mem
constexpr int kCore = 1;  // aliyun.com/gpu-core.percentage
constexpr const char* kNames[2] = {"aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage"};
constexpr int kMaxLive = 24;  // more live containers than this and one is always released first

// Python's random.Random: MT19937 seeded by init_by_array, with getrandbits/_randbelow/random as in CPython 3.11.
class PyRandom {
 public:
  explicit PyRandom(uint64_t seed) {
    std::vector<uint32_t> key;
    do {
      key.push_back(static_cast<uint32_t>(seed));
      seed >>= 32;
    } while (seed != 0);
    init_by_array(key);
  }

  double random() {  // [0, 1) with 53 random bits
    uint32_t a = next() >> 5, b = next() >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
  }

  uint32_t randbelow(uint32_t n) {  // [0, n), n > 0
    int k = 0;
    for (uint32_t v = n; v != 0; v >>= 1) ++k;  // n.bit_length()
    uint32_t r = getrandbits(k);
    while (r >= n) r = getrandbits(k);
    return r;
  }

  int randint(int a, int b) { return a + static_cast<int>(randbelow(static_cast<uint32_t>(b - a + 1))); }

  template <typename T>
  void shuffle(std::vector<T>& x) {
    for (size_t i = x.size() - 1; i >= 1; --i) std::swap(x[i], x[randbelow(static_cast<uint32_t>(i + 1))]);
  }

 private:
  static constexpr int N = 624, M = 397;
  std::array<uint32_t, N> mt_{};
  int mti_ = N;

  uint32_t getrandbits(int k) { return k == 0 ? 0 : next() >> (32 - k); }

  void init_genrand(uint32_t s) {
    mt_[0] = s;
    for (mti_ = 1; mti_ < N; ++mti_)
      mt_[mti_] = 1812433253U * (mt_[mti_ - 1] ^ (mt_[mti_ - 1] >> 30)) + static_cast<uint32_t>(mti_);
  }

  void init_by_array(const std::vector<uint32_t>& key) {
    init_genrand(19650218U);
    size_t i = 1, j = 0, len = key.size();
    for (size_t k = std::max<size_t>(N, len); k; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525U)) + key[j] + static_cast<uint32_t>(j);
      if (++i >= N) { mt_[0] = mt_[N - 1]; i = 1; }
      if (++j >= len) j = 0;
    }
    for (size_t k = N - 1; k; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941U)) - static_cast<uint32_t>(i);
      if (++i >= N) { mt_[0] = mt_[N - 1]; i = 1; }
    }
    mt_[0] = 0x80000000U;
  }

  uint32_t next() {
    static constexpr uint32_t mag01[2] = {0x0U, 0x9908b0dfU};
    if (mti_ >= N) {
      int kk = 0;
      for (; kk < N - M; ++kk) {
        uint32_t y = (mt_[kk] & 0x80000000U) | (mt_[kk + 1] & 0x7fffffffU);
        mt_[kk] = mt_[kk + M] ^ (y >> 1) ^ mag01[y & 1U];
      }
      for (; kk < N - 1; ++kk) {
        uint32_t y = (mt_[kk] & 0x80000000U) | (mt_[kk + 1] & 0x7fffffffU);
        mt_[kk] = mt_[kk + (M - N)] ^ (y >> 1) ^ mag01[y & 1U];
      }
      uint32_t y = (mt_[N - 1] & 0x80000000U) | (mt_[0] & 0x7fffffffU);
      mt_[N - 1] = mt_[M - 1] ^ (y >> 1) ^ mag01[y & 1U];
      mti_ = 0;
    }
    uint32_t y = mt_[mti_++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= (y >> 18);
    return y;
  }
};

struct Options {
  std::string sockets[2];
  uint64_t seed = 1;
  long admissions = 2000;
  long warmup = 50;
  bool driven = false;
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "admission_client: %s\n", msg.c_str());
  std::exit(2);
}

long parse_count(const char* flag, const char* value) {
  char* end = nullptr;
  long v = std::strtol(value, &end, 10);
  if (*value == '\0' || *end != '\0' || v < 0)
    die(std::string(flag) + " wants a non-negative integer, got '" + value + "'");
  return v;
}

Options parse_args(int argc, char** argv) {
  const char* usage =
      "usage: admission_client --mem-socket PATH --core-socket PATH [--seed N] [--admissions N] [--warmup N] "
      "[--driven]";
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::printf("%s\n", usage);
      std::exit(0);
    }
    if (flag == "--driven") {
      o.driven = true;
      continue;
    }
    if (i + 1 >= argc) die(flag + " needs a value; " + usage);
    const char* value = argv[++i];
    if (flag == "--mem-socket") o.sockets[kMem] = value;
    else if (flag == "--core-socket") o.sockets[kCore] = value;
    else if (flag == "--seed") o.seed = static_cast<uint64_t>(parse_count("--seed", value));
    else if (flag == "--admissions") o.admissions = parse_count("--admissions", value);
    else if (flag == "--warmup") o.warmup = parse_count("--warmup", value);
    else die("unknown option " + flag + "; " + usage);
  }
  if (o.sockets[kMem].empty() || o.sockets[kCore].empty())
    die(std::string("both --mem-socket and --core-socket are required; ") + usage);
  if (o.admissions == 0) die("--admissions must be at least 1");
  return o;
}

// One channel per plugin socket, connected before any timing starts.
std::unique_ptr<DevicePlugin::Stub> connect(const std::string& path, const char* resource) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode))
    die(std::string("no socket at ") + path + " for the " + resource +
        " plugin; is `devplugin serve` running with that --plugin-dir?");
  std::string target = "unix:" + (path[0] == '/' ? "//" + path : path);
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
    die(std::string("cannot connect to the ") + resource + " plugin at " + path +
        " within 10 s; is `devplugin serve` running with that --plugin-dir?");
  return DevicePlugin::NewStub(channel);
}

// All device IDs the plugin advertises (first ListAndWatch message), sorted as bench/admission.py sorts them.
std::vector<std::string> list_devices(DevicePlugin::Stub& stub, const char* resource) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub.ListAndWatch(&ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse first;
  if (!reader->Read(&first)) {
    grpc::Status st = reader->Finish();
    die(std::string("ListAndWatch on ") + resource + " sent no device list: " + st.error_message());
  }
  ctx.TryCancel();
  reader->Finish();
  std::vector<std::string> ids;
  ids.reserve(first.devices_size());
  for (const auto& d : first.devices()) ids.push_back(d.id());
  std::sort(ids.begin(), ids.end());
  if (ids.empty()) die(std::string("the ") + resource + " plugin advertises no devices");
  return ids;
}

// GetPreferredAllocation then Allocate with the IDs it preferred; false when either call is refused.
struct CallTimes {
  std::vector<double> gpa_ms, allocate_ms;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

bool admit_one(DevicePlugin::Stub& stub, const std::vector<std::string>& available, int size,
               std::vector<std::string>* ids, CallTimes* calls, std::string* why = nullptr) {
  auto t0 = std::chrono::steady_clock::now();
  v1beta1::PreferredAllocationRequest pref_req;
  auto* creq = pref_req.add_container_requests();
  creq->mutable_available_deviceids()->Reserve(static_cast<int>(available.size()));
  for (const auto& id : available) creq->add_available_deviceids(id);
  creq->set_allocation_size(size);
  v1beta1::PreferredAllocationResponse pref;
  {
    grpc::ClientContext ctx;
    grpc::Status st = stub.GetPreferredAllocation(&ctx, pref_req, &pref);
    if (!st.ok()) {
      if (why) *why = "GetPreferredAllocation: " + st.error_message();
      return false;
    }
  }
  calls->gpa_ms.push_back(ms_since(t0));
  if (pref.container_responses_size() != 1)
    die("GetPreferredAllocation answered " + std::to_string(pref.container_responses_size()) +
        " container responses for one container request");
  const auto& chosen = pref.container_responses(0).deviceids();
  v1beta1::AllocateRequest alloc_req;
  *alloc_req.add_container_requests()->mutable_devices_ids() = chosen;
  v1beta1::AllocateResponse alloc;
  grpc::ClientContext ctx;
  auto t1 = std::chrono::steady_clock::now();
  grpc::Status st = stub.Allocate(&ctx, alloc_req, &alloc);
  if (!st.ok()) {
    if (why) *why = "Allocate: " + st.error_message();
    return false;
  }
  calls->allocate_ms.push_back(ms_since(t1));
  ids->assign(chosen.begin(), chosen.end());
  return true;
}

// Same rule as bench/common.py: sorted[min(n - 1, round(p / 100 * (n - 1)))], round half to even.
double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::nearbyint(p / 100.0 * static_cast<double>(v.size() - 1)));
  return v[std::min(v.size() - 1, i)];
}

// Median of n empty RPCs (GetDevicePluginOptions): what any call costs before the plugin does any work.
double empty_rpc_p50(DevicePlugin::Stub& stub, int n) {
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    grpc::ClientContext ctx;
    v1beta1::DevicePluginOptions out;
    auto t0 = std::chrono::steady_clock::now();
    grpc::Status st = stub.GetDevicePluginOptions(&ctx, v1beta1::Empty(), &out);
    if (!st.ok()) die("GetDevicePluginOptions failed: " + st.error_message());
    t.push_back(ms_since(t0));
  }
  return percentile(t, 50);
}

using Container = std::map<int, std::vector<std::string>>;  // resource -> device IDs it got

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// The --driven loop: commands on stdin, one answer line each on stdout (see the header comment).
int run_driven(std::unique_ptr<DevicePlugin::Stub> (&stubs)[2], const std::vector<std::string> (&all_ids)[2],
               double empty_ms) {
  std::printf("ready empty_rpc_p50_ms=%.3f mem_ids=%zu core_ids=%zu\n", empty_ms, all_ids[kMem].size(),
              all_ids[kCore].size());
  std::fflush(stdout);
  std::unordered_set<std::string> held[2];
  std::map<std::string, Container> live;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, stdin)) {
    std::vector<std::string> words;
    for (char* w = std::strtok(buf, " \t\r\n"); w; w = std::strtok(nullptr, " \t\r\n")) words.emplace_back(w);
    if (words.empty()) continue;
    if (words[0] == "quit") break;
    if (words.size() < 2) die("a command needs an ID: '" + words[0] + "'");
    const std::string& id = words[1];
    if (words[0] == "release") {
      auto it = live.find(id);
      if (it != live.end()) {
        for (const auto& [res, ids] : it->second)
          for (const auto& d : ids) held[res].erase(d);
        live.erase(it);
      }
      std::printf("released %s\n", id.c_str());
      std::fflush(stdout);
      continue;
    }
    if (words[0] != "admit") die("unknown command '" + words[0] + "' (admit, release, quit)");
    std::vector<std::pair<int, int>> wanted;  // (resource, size) in call order
    for (size_t k = 2; k < words.size(); ++k) {
      auto eq = words[k].find('=');
      std::string name = words[k].substr(0, eq);
      if (eq == std::string::npos || (name != "mem" && name != "core"))
        die("admit wants mem=N and/or core=N, got '" + words[k] + "'");
      int n = static_cast<int>(parse_count(name.c_str(), words[k].c_str() + eq + 1));
      if (n > 0) wanted.emplace_back(name == "mem" ? kMem : kCore, n);
    }
    std::vector<std::string> avail[2];
    for (const auto& [res, n] : wanted)
      for (const auto& d : all_ids[res])
        if (!held[res].count(d)) avail[res].push_back(d);
    CallTimes calls;
    Container got;
    std::string why;
    bool ok = true;
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& [res, n] : wanted) {
      std::vector<std::string> ids;
      if (!admit_one(*stubs[res], avail[res], n, &ids, &calls, &why)) {
        ok = false;
        break;
      }
      got[res] = std::move(ids);
    }
    double total = ms_since(t0);
    if (!ok) {
      for (char& c : why)
        if (c == '\n') c = ' ';
      std::printf("refused %s %s\n", id.c_str(), why.c_str());
    } else {
      for (const auto& [res, ids] : got) held[res].insert(ids.begin(), ids.end());
      live[id] = std::move(got);
      std::printf("ok %s total_ms=%.4f gpa_ms=%.4f allocate_ms=%.4f\n", id.c_str(), total, sum(calls.gpa_ms),
                  sum(calls.allocate_ms));
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse_args(argc, argv);
  std::unique_ptr<DevicePlugin::Stub> stubs[2] = {connect(opt.sockets[kMem], kNames[kMem]),
                                                  connect(opt.sockets[kCore], kNames[kCore])};
  const std::vector<std::string> all_ids[2] = {list_devices(*stubs[kMem], kNames[kMem]),
                                               list_devices(*stubs[kCore], kNames[kCore])};
  static const int kCoreChoices[] = {5, 10, 15, 20, 25, 30};

  const double empty_ms = empty_rpc_p50(*stubs[kMem], 200);
  if (opt.driven) return run_driven(stubs, all_ids, empty_ms);

  PyRandom rng(opt.seed);
  CallTimes calls, warm_calls;
  std::unordered_set<std::string> held[2];
  std::vector<Container> live;
  std::vector<double> times_ms;
  times_ms.reserve(static_cast<size_t>(opt.admissions));
  long refused = 0;

  for (long i = 0; i < opt.admissions + opt.warmup; ++i) {
    if (live.size() > kMaxLive || (!live.empty() && rng.random() < 0.5)) {
      size_t k = rng.randbelow(static_cast<uint32_t>(live.size()));
      for (const auto& [res, ids] : live[k])
        for (const auto& id : ids) held[res].erase(id);
      live.erase(live.begin() + static_cast<long>(k));
    }
    int request[2];
    request[kMem] = rng.randint(1, 8);
    request[kCore] = kCoreChoices[rng.randbelow(6)];
    std::vector<int> order = {kMem, kCore};
    rng.shuffle(order);
    std::vector<std::string> avail[2];
    for (int res : order)
      for (const auto& id : all_ids[res])
        if (!held[res].count(id)) avail[res].push_back(id);

    Container got;
    bool ok = true;
    CallTimes* timed = i >= opt.warmup ? &calls : &warm_calls;
    auto t0 = std::chrono::steady_clock::now();
    for (int res : order) {
      std::vector<std::string> ids;
      if (!admit_one(*stubs[res], avail[res], request[res], &ids, timed)) {
        ok = false;
        break;
      }
      held[res].insert(ids.begin(), ids.end());
      got[res] = std::move(ids);
    }
    auto t1 = std::chrono::steady_clock::now();
    if (!ok) {
      ++refused;
      for (const auto& [res, ids] : got)
        for (const auto& id : ids) held[res].erase(id);
      continue;
    }
    live.push_back(std::move(got));
    if (i >= opt.warmup) times_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }

  if (times_ms.empty()) die("every admission was refused; nothing to report");
  std::printf(
      "admissions=%zu refused=%ld p50_ms=%.3f p99_ms=%.3f max_ms=%.3f gpa_p50_ms=%.3f allocate_p50_ms=%.3f "
      "empty_rpc_p50_ms=%.3f warmup=%ld mem_ids=%zu core_ids=%zu\n",
      times_ms.size(), refused, percentile(times_ms, 50), percentile(times_ms, 99),
      *std::max_element(times_ms.begin(), times_ms.end()), percentile(calls.gpa_ms, 50),
      percentile(calls.allocate_ms, 50), empty_ms, opt.warmup, all_ids[kMem].size(), all_ids[kCore].size());
  return 0;
}
