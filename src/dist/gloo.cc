/* gloo — dist.h over Gloo: the only C++ in the tree, so that everything else stays C.
 *
 * Owns: the Gloo context of one group (one pair per peer, TCP or ibverbs), the address exchange
 * through the caller's dist_store (a gloo::rendezvous::Store over its callbacks), the cache of
 * collective objects, and the point-to-point protocol. Refuses: to let an exception cross into
 * C (every entry point catches everything and returns -1 with the message), to wait without a
 * bound, and to serve a group that failed once (Gloo closes its pairs on the first error).
 *
 * Why it looks like this (measured on the 2-core dev VM, 2 ranks on loopback, 16 KB sum):
 * gloo::AllreduceRing on sync, busy-polled pairs takes ~35 us; the newer gloo::allreduce over
 * unbound buffers in async mode ~620 us. So pairs go to sync mode after connecting, and the
 * collectives are the bound-buffer algorithm classes, built once per message size and reused:
 * building one takes a slot from the context, and slots must stay in lockstep on every rank,
 * so the cache key is what every rank agrees on (the size, the root), never a pointer.
 * Small sums (decode's) skip Gloo's algorithms: DirectAllreduce sends every rank's buffer to
 * every other rank at once over the same pairs, one hop instead of the ring's 2(N-1).
 *
 * The address exchange is ours rather than gloo::rendezvous::Context::connectFullMesh because
 * the address a rank publishes may be a proxy's (tools/netproxy puts latency and a rate limit
 * in the path). Gloo's TCP pair decides who dials by comparing its own listening address with
 * the address it is given, so each rank publishes both its real and its advertised address,
 * both sides pick the dialer from the four, and each pair gets the address that makes Gloo
 * agree. */
#include "dist/dist.h"
#include "dist/dist_internal.h"

#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/ibverbs/device.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

using Millis = std::chrono::milliseconds;
namespace tcp = gloo::transport::tcp;

constexpr int kDefaultTimeoutMs = 30000;
/* Point-to-point slots sit far above the collectives' (which count up from 0 per object built). */
constexpr int kP2PSlotBase = 1 << 30;
/* Up to this size a message goes through the ring (1 round for 2 ranks, no chunking: the
 * latency-bound decode case); above it, with more than 2 ranks, through halving-doubling,
 * which sends 2(p-1)/p of the buffer instead of the ring's p-1 whole copies. */
constexpr size_t kRingMaxBytes = 256 << 10;
/* Up to this size (EXO_DIST_ALLREDUCE=auto, the default) a sum goes direct: every rank sends its
 * whole buffer to every other rank at once, one message hop whatever the group size, at (N-1)
 * buffers sent per rank. Decode's all-reduces (hidden size x tokens floats) are a few KB to tens
 * of KB, where the ring's 2(N-1) sequential hops are the whole cost. */
constexpr size_t kDirectAutoMaxBytes = 64 << 10;
/* EXO_DIST_ALLREDUCE=direct goes direct up to here. Each rank writes N-1 copies before it reads
 * any, so the copies must fit the sockets' buffers (Gloo sizes SO_SNDBUF to the message, capped by
 * net.core.wmem_max, 208 KB by default) or two ranks writing to each other could both block. */
constexpr size_t kDirectMaxBytes = 128 << 10;
/* Gloo's algorithms keep byte counts in an int; longer sums run in pieces of this many floats. */
constexpr size_t kMaxFloatsPerRun = size_t(1) << 28;
/* The cache is dropped whole (on every rank alike: it depends only on the call sequence) past
 * this many objects or bytes of scratch, so a caller cycling through sizes cannot grow it. */
constexpr size_t kMaxCachedObjects = 64;
constexpr size_t kMaxCachedBytes = size_t(512) << 20;

void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The first line of a Gloo message: they carry a "[file:line]" prefix and sometimes a trace. */
std::string gloo_message(const std::exception &e) {
    std::string m = e.what();
    if (m.size() > 1 && m[0] == '[') {
        size_t close = m.find("] ");
        if (close != std::string::npos) m = m.substr(close + 2);
    }
    size_t nl = m.find('\n');
    if (nl != std::string::npos) m.resize(nl);
    return m;
}

/* gloo::rendezvous::Store over the caller's callbacks; keys live under "<prefix>/". A get that
 * times out throws gloo::IoException like every other failed wait in Gloo. */
class CallbackStore : public gloo::rendezvous::Store {
  public:
    CallbackStore(const dist_store &store, std::string prefix, int timeout_ms)
        : store_(store), prefix_(std::move(prefix)), timeout_ms_(timeout_ms) {}

    void set(const std::string &key, const std::vector<char> &data) override {
        std::string full = prefix_ + "/" + key;
        if (store_.set(store_.ctx, full.c_str(), data.data(), data.size()) != 0)
            throw gloo::IoException("store: publishing key '" + full + "' failed");
    }

    std::vector<char> get(const std::string &key) override {
        return get(key, Millis(timeout_ms_));
    }

    std::vector<char> get(const std::string &key, Millis timeout) {
        std::string full = prefix_ + "/" + key;
        void *value = nullptr;
        size_t len = 0;
        if (store_.get(store_.ctx, full.c_str(), &value, &len, int(timeout.count())) != 0)
            throw gloo::IoException("store: key '" + full + "' did not appear within " +
                                    std::to_string(timeout.count()) + " ms");
        std::vector<char> out((char *)value, (char *)value + len);
        free(value);
        return out;
    }

    void wait(const std::vector<std::string> &keys) override {
        wait(keys, Millis(timeout_ms_));
    }

    void wait(const std::vector<std::string> &keys, const Millis &timeout) override {
        for (const auto &k : keys)
            get(k, timeout);
    }

  private:
    const dist_store &store_;
    std::string prefix_;
    int timeout_ms_;
};

/* A gloo::Context whose device and transport context we set ourselves (connectFullMesh is the
 * only other way in, and it publishes addresses we cannot choose). */
class MeshContext : public gloo::Context {
  public:
    MeshContext(int rank, int size) : gloo::Context(rank, size) {}
    void adopt(std::shared_ptr<gloo::transport::Device> device,
               std::shared_ptr<gloo::transport::Context> transport) {
        device_ = std::move(device);
        transportContext_ = std::move(transport);
    }
};

/* A transport context whose pair to peer p comes from a device of its own, so it listens on a
 * port fixed in advance (a proxy must know where to forward before the ranks start; one device
 * binds all its pairs to one address). Each pair is made by its device's own TCP context and
 * moved here; that context stays alive beside it (Gloo's pair keeps a pointer to it for the
 * unbound-buffer path, which we never use). Debian's package lacks a header that tcp::Context
 * and tcp::Pair need, so composing through the generic interfaces is also the only way. */
class PerPeerDeviceContext : public gloo::transport::Context {
  public:
    PerPeerDeviceContext(std::vector<std::shared_ptr<gloo::transport::Device>> devices, int rank,
                         int size)
        : gloo::transport::Context(rank, size), devices_(std::move(devices)),
          origins_(size_t(size)) {}
    ~PerPeerDeviceContext() override {
        pairs_.clear(); /* before their devices and contexts */
    }

    std::unique_ptr<gloo::transport::Pair> &createPair(int peer) override {
        origins_[peer] = devices_[peer]->createContext(rank, size);
        origins_[peer]->setTimeout(getTimeout());
        pairs_[peer] = std::move(origins_[peer]->createPair(peer));
        return pairs_[peer];
    }

    std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void *, size_t) override {
        throw gloo::InvalidOperationException(
            "dist: unbound buffers are not used on fixed-port pairs");
    }

  private:
    std::vector<std::shared_ptr<gloo::transport::Device>> devices_; /* [peer]; null for ourselves */
    std::vector<std::shared_ptr<gloo::transport::Context>> origins_;
};

/* The ring copies the caller's buffer into its own inbox/outbox each run, so only ptrs_[0]
 * refers to the caller: pointing it elsewhere between runs is safe and saves a copy. */
class RebindableRing : public gloo::AllreduceRing<float> {
  public:
    RebindableRing(const std::shared_ptr<gloo::Context> &ctx, float *ptr, int count)
        : gloo::AllreduceRing<float>(ctx, std::vector<float *>{ptr}, count) {}
    void run_on(float *ptr) {
        ptrs_[0] = ptr;
        run();
    }
};

/* A collective bound at construction to its own scratch buffer (halving-doubling and broadcast
 * send straight from the bound pointer, so they cannot be re-pointed like the ring). */
struct ScratchCollective {
    std::vector<char> scratch;
    std::unique_ptr<gloo::Algorithm> algorithm;
};

/* The direct all-reduce for one message size, built once and reused (no per-call allocation).
 * Every rank sends its whole buffer to every peer, then sums the N contributions in rank order
 * 0..N-1, its own included, with the same loop: the terms and their order are the same on every
 * rank, so every rank gets the bit-identical sum (tensor-parallel ranks must agree exactly; the
 * ring sums in a different order on each rank, see dist_allreduce_sum).
 *
 * Two inboxes per peer, used alternately (by call parity), so no flow control is needed on any
 * transport: a peer's call k+2 can only start after our call k+1 data reached it, which we send
 * only after summing call k, so a message can never land in an inbox that is still being read.
 * (Over TCP in sync mode data moves only while the receiver reads, but ibverbs writes into the
 * registered memory whenever the sender sends.) */
class DirectAllreduce {
  public:
    DirectAllreduce(const std::shared_ptr<gloo::Context> &ctx, size_t count)
        : rank_(ctx->rank), size_(ctx->size), count_(count), outbox_(count),
          inboxes_(size_t(2 * ctx->size) * count), terms_(size_t(ctx->size)) {
        const size_t bytes = count * sizeof(float);
        /* Both parities' slots from the context's counter, so every rank (building the same
         * objects in the same order) agrees on them. */
        const int base_slot = ctx->nextSlot(2);
        send_.resize(size_t(2 * size_));
        recv_.resize(size_t(2 * size_));
        for (int parity = 0; parity < 2; parity++) {
            for (int p = 0; p < size_; p++) {
                if (p == rank_) continue;
                auto &pair = ctx->getPair(p);
                send_[index(parity, p)] =
                    pair->createSendBuffer(base_slot + parity, outbox_.data(), bytes);
                recv_[index(parity, p)] =
                    pair->createRecvBuffer(base_slot + parity, inbox(parity, p), bytes);
            }
        }
    }

    /* Scratch held: the outbox and two inboxes per peer. */
    static size_t scratch_bytes(int size, size_t count) {
        return size_t(1 + 2 * (size - 1)) * count * sizeof(float);
    }

    void run(float *buf) {
        const int parity = parity_;
        parity_ ^= 1;
        memcpy(outbox_.data(), buf, count_ * sizeof(float));
        for (int p = 0; p < size_; p++)
            if (p != rank_) send_[index(parity, p)]->send();
        for (int p = 0; p < size_; p++) {
            if (p == rank_) {
                terms_[size_t(p)] = outbox_.data();
                continue;
            }
            recv_[index(parity, p)]->waitRecv();
            terms_[size_t(p)] = inbox(parity, p);
        }
        /* One pass per term, each element ((t0 + t1) + t2) + ...: vectorizable, same bits. */
        const float *first = terms_[0], *second = terms_[1];
        for (size_t i = 0; i < count_; i++)
            buf[i] = first[i] + second[i];
        for (int r = 2; r < size_; r++) {
            const float *term = terms_[size_t(r)];
            for (size_t i = 0; i < count_; i++)
                buf[i] += term[i];
        }
        /* Before the outbox may change (ibverbs reads it after send() returns). */
        for (int p = 0; p < size_; p++)
            if (p != rank_) send_[index(parity, p)]->waitSend();
    }

  private:
    size_t index(int parity, int peer) const {
        return size_t(parity * size_ + peer);
    }
    float *inbox(int parity, int peer) {
        return inboxes_.data() + index(parity, peer) * count_;
    }

    const int rank_, size_;
    const size_t count_;
    int parity_ = 0;
    std::vector<float> outbox_;
    std::vector<float> inboxes_; /* [parity][peer][count]; our own rank's rows unused */
    std::vector<const float *> terms_;
    std::vector<std::unique_ptr<gloo::transport::Buffer>> send_, recv_; /* [parity][peer] */
};

/* How dist_allreduce_sum picks its algorithm (EXO_DIST_ALLREDUCE, for A/B measurements). The
 * values travel in the address record. */
enum class AllreduceMode : uint32_t { kAuto = 0, kRing = 1, kDirect = 2 };

std::string allreduce_mode_name(uint32_t mode) {
    switch (AllreduceMode(mode)) {
    case AllreduceMode::kAuto:
        return "auto";
    case AllreduceMode::kRing:
        return "ring";
    case AllreduceMode::kDirect:
        return "direct";
    }
    return "unknown (" + std::to_string(mode) + ")";
}

/* ---- addresses ---------------------------------------------------------------------------- */

/* Gloo's own order (tcp/pair.cc): memcmp of the IP, then the difference of the ports as stored
 * (network order). The side whose listening address is greater dials. */
int gloo_address_order(const sockaddr_storage &a, const sockaddr_storage &b) {
    if (a.ss_family == AF_INET) {
        auto *x = (const sockaddr_in *)&a, *y = (const sockaddr_in *)&b;
        int rv = memcmp(&x->sin_addr, &y->sin_addr, sizeof x->sin_addr);
        return rv ? rv : x->sin_port - y->sin_port;
    }
    auto *x = (const sockaddr_in6 *)&a, *y = (const sockaddr_in6 *)&b;
    int rv = memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr);
    return rv ? rv : x->sin6_port - y->sin6_port;
}

int sockaddr_port(const sockaddr_storage &ss) {
    return ntohs(ss.ss_family == AF_INET ? ((const sockaddr_in *)&ss)->sin_port
                                         : ((const sockaddr_in6 *)&ss)->sin6_port);
}

void sockaddr_set_port(sockaddr_storage &ss, int port) {
    if (ss.ss_family == AF_INET)
        ((sockaddr_in *)&ss)->sin_port = htons(uint16_t(port));
    else
        ((sockaddr_in6 *)&ss)->sin6_port = htons(uint16_t(port));
}

std::string sockaddr_text(const sockaddr_storage &ss) {
    char host[INET6_ADDRSTRLEN + 2] = "?";
    getnameinfo((const sockaddr *)&ss, sizeof ss, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
    return (ss.ss_family == AF_INET6 ? "[" + std::string(host) + "]" : std::string(host)) + ":" +
           std::to_string(sockaddr_port(ss));
}

sockaddr_storage resolve_host(const char *host, int family) {
    addrinfo hints = {}, *res = nullptr;
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, nullptr, &hints, &res);
    if (rc != 0 || !res)
        throw gloo::InvalidOperationException(std::string("cannot resolve '") + host +
                                              "': " + gai_strerror(rc));
    sockaddr_storage ss = {};
    memcpy(&ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return ss;
}

/* What each rank publishes under "addr/<rank>": the all-reduce mode it runs (the ranks must
 * agree, checked at connect rather than by a failing first sum), its host name (ranks sharing a
 * host share its cores, which decides busy polling), then for every peer p the transport address
 * of its pair to p as listened on and as advertised (for TCP: gloo::transport::tcp::Address
 * bytes). Layout: magic, address length (u32), mode (u32), host, addresses. */
struct AddressRecord {
    static constexpr char kMagic[8] = {'e', 'x', 'o', 'd', 'i', 's', 't', '2'};
    static constexpr size_t kHostLen = 64;
    static constexpr size_t kHead = 8 + 4 + 4 + kHostLen;
    uint32_t allreduce_mode = 0;
    std::string host;
    std::vector<std::vector<char>> listen, advertise; /* [peer] */

    std::vector<char> encode(uint32_t addr_len) const {
        std::vector<char> out(kHead + listen.size() * 2 * addr_len, 0);
        char *p = out.data();
        memcpy(p, kMagic, 8);
        memcpy(p + 8, &addr_len, 4);
        memcpy(p + 12, &allreduce_mode, 4);
        memcpy(p + 16, host.data(), std::min(host.size(), kHostLen - 1));
        p += kHead;
        for (size_t i = 0; i < listen.size(); i++, p += 2 * addr_len) {
            if (listen[i].size() == addr_len) memcpy(p, listen[i].data(), addr_len);
            if (advertise[i].size() == addr_len)
                memcpy(p + addr_len, advertise[i].data(), addr_len);
        }
        return out;
    }

    static AddressRecord decode(const std::vector<char> &in, int size, int from) {
        uint32_t addr_len = 0;
        if (in.size() >= kHead) memcpy(&addr_len, in.data() + 8, 4);
        if (in.size() < kHead || memcmp(in.data(), kMagic, 8) != 0 || addr_len == 0 ||
            addr_len > 4096 || in.size() != kHead + size_t(size) * 2 * addr_len)
            throw gloo::InvalidOperationException(
                "store: the address record of rank " + std::to_string(from) + " is malformed (" +
                std::to_string(in.size()) +
                " bytes; another exo version, or a group of another size?)");
        AddressRecord r;
        memcpy(&r.allreduce_mode, in.data() + 12, 4);
        r.host.assign(in.data() + 16, strnlen(in.data() + 16, kHostLen));
        const char *p = in.data() + kHead;
        for (int i = 0; i < size; i++, p += 2 * addr_len) {
            r.listen.emplace_back(p, p + addr_len);
            r.advertise.emplace_back(p + addr_len, p + 2 * addr_len);
        }
        return r;
    }
};

std::string local_host_name() {
    char h[256] = {0};
    if (gethostname(h, sizeof h - 1) != 0) return "?";
    return h;
}

} // namespace

/* ---- the group ---------------------------------------------------------------------------- */

struct dist_group {
    int rank = 0, size = 1;
    int timeout_ms = kDefaultTimeoutMs;
    bool is_tcp = true;
    AllreduceMode allreduce_mode = AllreduceMode::kAuto;
    std::string failure; /* set by the first failed call; the pairs are gone after it */

    /* Declared before everything holding Gloo buffers: members die in reverse order, and a
     * buffer unregisters from its pair when destroyed. */
    std::shared_ptr<MeshContext> context;

    std::unique_ptr<gloo::BarrierAllToOne> barrier;
    std::map<size_t, std::unique_ptr<RebindableRing>> rings;        /* by float count */
    std::map<size_t, ScratchCollective> halving_doubling;           /* by float count */
    std::map<size_t, std::unique_ptr<DirectAllreduce>> directs;     /* by float count */
    std::map<std::pair<int, size_t>, ScratchCollective> broadcasts; /* by (root, bytes) */
    size_t cached_objects = 0, cached_bytes = 0;

    /* Point to point, per peer: before a message goes from s to r, r sends s one credit holding
     * the byte count it posted a buffer for. So a message never arrives before its buffer is
     * registered (Gloo fails on that in sync mode), never overwrites an unread one, and a size
     * mismatch is an error on both ends instead of a torn read. */
    std::vector<int64_t> credit_in, credit_out;
    std::vector<std::unique_ptr<gloo::transport::Buffer>> credit_recv, credit_send;
};

namespace {

enum class Algorithm { kDirect, kRing, kHalvingDoubling };

/* Direct for latency-bound sizes (one hop); above that the ring up to kRingMaxBytes and for 2
 * ranks (one exchange of the whole buffer either way); halving-doubling past it with more ranks. */
Algorithm allreduce_algorithm(const dist_group *g, size_t count) {
    const size_t bytes = count * sizeof(float);
    if ((g->allreduce_mode == AllreduceMode::kAuto && bytes <= kDirectAutoMaxBytes) ||
        (g->allreduce_mode == AllreduceMode::kDirect && bytes <= kDirectMaxBytes))
        return Algorithm::kDirect;
    if (bytes <= kRingMaxBytes || g->size == 2) return Algorithm::kRing;
    return Algorithm::kHalvingDoubling;
}

/* EXO_DIST_ALLREDUCE: auto (unset), ring (never direct) or direct (direct up to kDirectMaxBytes).
 * Every rank of a group must see the same value (the algorithms do not interoperate):
 * dist_connect compares them. Returns false on an unknown value. */
bool parse_allreduce_mode(const char *text, AllreduceMode *out) {
    if (!text || !*text || !strcmp(text, "auto"))
        *out = AllreduceMode::kAuto;
    else if (!strcmp(text, "ring"))
        *out = AllreduceMode::kRing;
    else if (!strcmp(text, "direct"))
        *out = AllreduceMode::kDirect;
    else
        return false;
    return true;
}

int p2p_data_slot(int from, int to) {
    return kP2PSlotBase + (from < to ? 0 : 1);
}
int p2p_credit_slot(int from, int to) {
    return kP2PSlotBase + 2 + (from < to ? 0 : 1);
}

void drop_cache_if_full(dist_group *g, size_t adding_bytes) {
    if (g->cached_objects + 1 <= kMaxCachedObjects &&
        g->cached_bytes + adding_bytes <= kMaxCachedBytes)
        return;
    g->rings.clear();
    g->halving_doubling.clear();
    g->directs.clear();
    g->broadcasts.clear();
    g->cached_objects = g->cached_bytes = 0;
}

/* Runs op; turns any exception into -1 and "what: message", and marks the group failed. */
template <typename Op>
int guarded(dist_group *g, const char *what, char *err, size_t errlen, Op op) {
    if (!g) {
        set_err(err, errlen, "%s: no group", what);
        return -1;
    }
    if (!g->failure.empty()) {
        set_err(err, errlen, "%s: the group failed earlier (%s); close it and connect again", what,
                g->failure.c_str());
        return -1;
    }
    try {
        op();
        return 0;
    } catch (const std::exception &e) {
        g->failure = gloo_message(e);
    } catch (...) {
        g->failure = "unknown error";
    }
    set_err(err, errlen, "%s (rank %d of %d): %s", what, g->rank, g->size, g->failure.c_str());
    return -1;
}

struct Devices {
    std::shared_ptr<gloo::transport::Device> shared; /* the one device (fixed ports: any) */
    std::vector<std::shared_ptr<gloo::transport::Device>> per_peer; /* fixed ports: one per peer */
};

std::shared_ptr<gloo::transport::Context> make_transport(const dist_config *c, Devices &devs) {
    if (!c->transport || !strcmp(c->transport, "tcp")) {
        tcp::attr attr(c->bind_host ? c->bind_host : "127.0.0.1");
        /* Gloo's own lookup checks getaddrinfo(3) only for -1, so a name that does not
         * resolve (EAI_NONAME is -2) makes it walk an uninitialized list and crash. */
        resolve_host(attr.hostname.c_str(), AF_UNSPEC);
        if (!c->port_base) {
            devs.shared = tcp::CreateDevice(attr);
            return devs.shared->createContext(c->rank, c->size);
        }
        tcp::attr resolved = tcp::CreateDeviceAttr(attr);
        devs.per_peer.resize(size_t(c->size)); /* none for ourselves */
        for (int p = 0; p < c->size; p++) {
            if (p == c->rank) continue;
            tcp::attr a = resolved;
            sockaddr_set_port(a.ai_addr, c->port_base + c->rank * c->size + p);
            devs.per_peer[p] = std::make_shared<tcp::Device>(a);
        }
        devs.shared = devs.per_peer[c->rank == 0 ? 1 : 0];
        return std::make_shared<PerPeerDeviceContext>(devs.per_peer, c->rank, c->size);
    }
    gloo::transport::ibverbs::attr attr;
    attr.name = ""; /* the first device */
    attr.port = 1;
    attr.index = 0;
    auto names = gloo::transport::ibverbs::getDeviceNames();
    if (names.empty())
        throw gloo::InvalidOperationException("transport ibverbs: no RDMA device on this host");
    attr.name = names[0];
    devs.shared = gloo::transport::ibverbs::CreateDevice(attr);
    return devs.shared->createContext(c->rank, c->size);
}

/* The address others dial for our pair to `peer`: the listening one, or advertise_host at the
 * listening port + advertise_port_offset. */
std::vector<char> advertised_address(const dist_config *c, const tcp::Address &listening) {
    sockaddr_storage ss = listening.getSockaddr();
    if (c->advertise_host && *c->advertise_host) {
        int port = sockaddr_port(ss) + c->advertise_port_offset;
        ss = resolve_host(c->advertise_host, ss.ss_family);
        sockaddr_set_port(ss, port);
    }
    return tcp::Address(ss, listening.getSeq()).bytes();
}

/* An address that sorts after every real one: the listening side of a pair is told this, so
 * Gloo's comparison makes it wait for the dial instead of dialing. */
std::vector<char> address_above_all(int family) {
    sockaddr_storage ss = {};
    ss.ss_family = sa_family_t(family);
    if (family == AF_INET) {
        auto *in = (sockaddr_in *)&ss;
        in->sin_addr.s_addr = 0xffffffffu;
        in->sin_port = 0xffff;
    } else {
        auto *in6 = (sockaddr_in6 *)&ss;
        memset(&in6->sin6_addr, 0xff, sizeof in6->sin6_addr);
        in6->sin6_port = 0xffff;
    }
    return tcp::Address(ss).bytes();
}

/* For the TCP pair between us and `peer`: the address to hand our pair's connect(). One side
 * dials the other's advertised address; Gloo lets a side dial only when its own listening
 * address sorts above the address it dials, so the dialer is chosen among the sides allowed to
 * (the higher rank when both are), and the other side is handed an address that keeps it
 * listening. */
std::vector<char> tcp_connect_address(int rank, int peer, const AddressRecord &mine,
                                      const AddressRecord &theirs) {
    tcp::Address my_listen(mine.listen[peer]), their_listen(theirs.listen[rank]);
    tcp::Address my_adv(mine.advertise[peer]), their_adv(theirs.advertise[rank]);
    if (my_listen.getSockaddr().ss_family != their_adv.getSockaddr().ss_family)
        throw gloo::InvalidOperationException("rank " + std::to_string(peer) +
                                              " uses another address family");
    bool i_can_dial = gloo_address_order(my_listen.getSockaddr(), their_adv.getSockaddr()) > 0;
    bool they_can_dial = gloo_address_order(their_listen.getSockaddr(), my_adv.getSockaddr()) > 0;
    if (!i_can_dial && !they_can_dial)
        throw gloo::InvalidOperationException(
            "neither side of the pair with rank " + std::to_string(peer) +
            " can dial: Gloo dials only from a listening address (" +
            sockaddr_text(my_listen.getSockaddr()) + ", " +
            sockaddr_text(their_listen.getSockaddr()) +
            ") that sorts above the advertised one it dials (" +
            sockaddr_text(their_adv.getSockaddr()) + ", " + sockaddr_text(my_adv.getSockaddr()) +
            "); bind a specific address (not 0.0.0.0), and put a proxy on an address "
            "that sorts below the ranks' (e.g. ranks on 127.0.0.2, proxy on 127.0.0.1)");
    bool i_dial = i_can_dial && (!they_can_dial || rank > peer);
    if (i_dial) return theirs.advertise[rank];
    /* Gloo keeps what it is given as the peer's name in its messages: the peer's real address
     * where that keeps us listening, else one that sorts above everything. */
    if (gloo_address_order(my_listen.getSockaddr(), their_listen.getSockaddr()) < 0)
        return theirs.listen[rank];
    return address_above_all(my_listen.getSockaddr().ss_family);
}

void connect_pairs(dist_group *g, const dist_config *c, const dist_store *store,
                   gloo::transport::Context &transport) {
    const auto deadline = std::chrono::steady_clock::now() + Millis(g->timeout_ms);
    CallbackStore kv(*store, c->prefix && *c->prefix ? c->prefix : "dist", g->timeout_ms);

    AddressRecord mine;
    mine.allreduce_mode = uint32_t(g->allreduce_mode);
    mine.host = local_host_name();
    mine.listen.resize(size_t(c->size));
    mine.advertise.resize(size_t(c->size));
    uint32_t addr_len = 0;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        auto &pair = transport.createPair(p);
        mine.listen[p] = pair->address().bytes();
        mine.advertise[p] = g->is_tcp ? advertised_address(c, (const tcp::Address &)pair->address())
                                      : mine.listen[p];
        addr_len = uint32_t(mine.listen[p].size());
    }
    kv.set("addr/" + std::to_string(c->rank), mine.encode(addr_len));

    /* Every record is read and checked, and every pair's address chosen, before any pair
     * connects: a rank that stopped at a mismatch after connecting some pairs would break its
     * peers' half-finished handshakes, and they would report a closed connection instead. */
    std::vector<std::vector<char>> dial(size_t(c->size));
    int ranks_on_host = 1;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
        std::vector<char> blob;
        try {
            blob = kv.get("addr/" + std::to_string(p), std::max(left, Millis(1)));
        } catch (const gloo::IoException &e) {
            throw gloo::IoException("rank " + std::to_string(p) + " did not join within " +
                                    std::to_string(g->timeout_ms) + " ms (" + gloo_message(e) +
                                    ")");
        }
        AddressRecord theirs = AddressRecord::decode(blob, c->size, p);
        if (theirs.allreduce_mode != mine.allreduce_mode)
            throw gloo::InvalidOperationException(
                "rank " + std::to_string(p) + " runs EXO_DIST_ALLREDUCE=" +
                allreduce_mode_name(theirs.allreduce_mode) + ", this rank " +
                allreduce_mode_name(mine.allreduce_mode) + " (every rank must run the same)");
        if (theirs.host == mine.host) ranks_on_host++;
        dial[p] =
            g->is_tcp ? tcp_connect_address(c->rank, p, mine, theirs) : theirs.listen[c->rank];
    }
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        try {
            transport.getPair(p)->connect(dial[p]);
        } catch (const std::exception &e) {
            throw gloo::IoException("connecting to rank " + std::to_string(p) + ": " +
                                    gloo_message(e));
        }
    }

    /* Busy polling answers a message ~10x sooner than sleeping in recv(2), but a spinning rank
     * holds a core: with more ranks than cores on one host they would starve each other. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    bool busy_poll = ranks_on_host <= (cores > 0 ? cores : 1);
    for (int p = 0; p < c->size; p++)
        if (p != c->rank) transport.getPair(p)->setSync(true, busy_poll);
}

void setup_p2p(dist_group *g) {
    size_t n = size_t(g->size);
    g->credit_in.assign(n, 0);
    g->credit_out.assign(n, 0);
    g->credit_recv.resize(n);
    g->credit_send.resize(n);
    for (int p = 0; p < g->size; p++) {
        if (p == g->rank) continue;
        auto &pair = g->context->getPair(p);
        /* Credits for what we send to p arrive from p; credits for what p sends us go to p. */
        g->credit_recv[p] =
            pair->createRecvBuffer(p2p_credit_slot(g->rank, p), &g->credit_in[p], sizeof(int64_t));
        g->credit_send[p] =
            pair->createSendBuffer(p2p_credit_slot(p, g->rank), &g->credit_out[p], sizeof(int64_t));
    }
}

int check_peer(dist_group *g, int peer, const char *what, char *err, size_t errlen) {
    if (!g) {
        set_err(err, errlen, "%s: no group", what);
        return -1;
    }
    if (peer < 0 || peer >= g->size || peer == g->rank) {
        set_err(err, errlen, "%s: rank %d is not a peer of rank %d in a group of %d", what, peer,
                g->rank, g->size);
        return -1;
    }
    return 0;
}

} // namespace

/* ---- the C surface ------------------------------------------------------------------------ */

extern "C" {

dist_group *dist_connect(const dist_config *c, const dist_store *store, char *err, size_t errlen) {
    if (!c || !store || !store->set || !store->get) {
        set_err(err, errlen, "dist_connect: missing config or store");
        return nullptr;
    }
    if (c->size < 1 || c->rank < 0 || c->rank >= c->size) {
        set_err(err, errlen, "dist_connect: rank %d does not fit a group of %d", c->rank, c->size);
        return nullptr;
    }
    bool tcp_transport = !c->transport || !strcmp(c->transport, "tcp");
    if (!tcp_transport && strcmp(c->transport, "ibverbs") != 0) {
        set_err(err, errlen, "dist_connect: unknown transport '%s' (tcp or ibverbs)", c->transport);
        return nullptr;
    }
    if (c->port_base < 0 || c->port_base + c->size * c->size > 65535 ||
        c->advertise_port_offset < -65535 || c->advertise_port_offset > 65535) {
        set_err(err, errlen, "dist_connect: port_base %d / advertise_port_offset %d out of range",
                c->port_base, c->advertise_port_offset);
        return nullptr;
    }
    if (c->advertise_port_offset && !c->port_base) {
        set_err(err, errlen,
                "dist_connect: advertise_port_offset needs port_base (a proxy must know the ports "
                "in advance)");
        return nullptr;
    }
    if (!tcp_transport && (c->port_base || (c->advertise_host && *c->advertise_host))) {
        set_err(err, errlen,
                "dist_connect: ports and advertise_host apply to the tcp transport only");
        return nullptr;
    }
    AllreduceMode allreduce_mode;
    const char *mode_text = getenv("EXO_DIST_ALLREDUCE");
    if (!parse_allreduce_mode(mode_text, &allreduce_mode)) {
        set_err(err, errlen, "dist_connect: EXO_DIST_ALLREDUCE='%s' is not auto, ring or direct",
                mode_text);
        return nullptr;
    }
    /* A peer that dies mid-write must be an error from writev(2), not a signal that kills us. */
    struct sigaction old;
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);

    auto g = std::make_unique<dist_group>();
    g->rank = c->rank;
    g->size = c->size;
    g->timeout_ms = c->timeout_ms > 0 ? c->timeout_ms : kDefaultTimeoutMs;
    g->is_tcp = tcp_transport;
    g->allreduce_mode = allreduce_mode;
    Devices devs;
    try {
        g->context = std::make_shared<MeshContext>(c->rank, c->size);
        g->context->setTimeout(Millis(g->timeout_ms));
        if (c->size > 1) {
            auto transport = make_transport(c, devs);
            transport->setTimeout(Millis(g->timeout_ms));
            connect_pairs(g.get(), c, store, *transport);
            g->context->adopt(devs.shared, transport);
            setup_p2p(g.get());
        }
        g->barrier = std::make_unique<gloo::BarrierAllToOne>(g->context, 0);
        /* Nobody leaves connect before everybody has connected: a rank that fails right after
         * (a refused shard, say) must not break a peer's half-finished handshake, or the peer
         * reports "connection closed" instead of the real error. */
        if (c->size > 1) g->barrier->run();
    } catch (const std::exception &e) {
        set_err(err, errlen, "dist_connect (rank %d of %d): %s", c->rank, c->size,
                gloo_message(e).c_str());
        return nullptr;
    } catch (...) {
        set_err(err, errlen, "dist_connect (rank %d of %d): unknown error", c->rank, c->size);
        return nullptr;
    }
    return g.release();
}

void dist_close(dist_group *g) {
    if (!g) return;
    try {
        delete g;
    } catch (...) {
        /* A destructor that throws leaves nothing we can repair; the sockets close with the
         * process. */
    }
}

int dist_rank(const dist_group *g) {
    return g ? g->rank : -1;
}
int dist_size(const dist_group *g) {
    return g ? g->size : -1;
}

int dist_allreduce_sum(dist_group *g, float *buf, size_t n, char *err, size_t errlen) {
    if (n && !buf) {
        set_err(err, errlen, "dist_allreduce_sum: no buffer");
        return -1;
    }
    return guarded(g, "dist_allreduce_sum", err, errlen, [&] {
        if (g->size == 1) return;
        for (size_t done = 0; done < n;) {
            size_t count = std::min(n - done, kMaxFloatsPerRun);
            float *p = buf + done;
            size_t bytes = count * sizeof(float);
            Algorithm algorithm = allreduce_algorithm(g, count);
            if (algorithm == Algorithm::kDirect) {
                auto it = g->directs.find(count);
                if (it == g->directs.end()) {
                    size_t scratch = DirectAllreduce::scratch_bytes(g->size, count);
                    drop_cache_if_full(g, scratch);
                    it = g->directs
                             .emplace(count, std::make_unique<DirectAllreduce>(g->context, count))
                             .first;
                    g->cached_objects++;
                    g->cached_bytes += scratch;
                }
                it->second->run(p);
            } else if (algorithm == Algorithm::kRing) {
                /* Rank r adds the others' buffers in the order they travel the ring (r-1, r-2,
                 * ...), so with 3 or more ranks the float sums differ in the last bits from rank
                 * to rank; with 2 both add the same two numbers. Direct sums in rank order. */
                auto it = g->rings.find(count);
                if (it == g->rings.end()) {
                    drop_cache_if_full(g, 2 * bytes);
                    it = g->rings
                             .emplace(count,
                                      std::make_unique<RebindableRing>(g->context, p, int(count)))
                             .first;
                    g->cached_objects++;
                    g->cached_bytes += 2 * bytes; /* the ring's inbox and outbox */
                }
                it->second->run_on(p);
            } else {
                auto it = g->halving_doubling.find(count);
                if (it == g->halving_doubling.end()) {
                    drop_cache_if_full(g, 2 * bytes);
                    ScratchCollective sc;
                    sc.scratch.resize(bytes);
                    sc.algorithm = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(
                        g->context, std::vector<float *>{(float *)sc.scratch.data()}, int(count));
                    it = g->halving_doubling.emplace(count, std::move(sc)).first;
                    g->cached_objects++;
                    g->cached_bytes += 2 * bytes; /* scratch and the algorithm's receive buffer */
                }
                memcpy(it->second.scratch.data(), p, bytes);
                it->second.algorithm->run();
                memcpy(p, it->second.scratch.data(), bytes);
            }
            done += count;
        }
    });
}

int dist_broadcast(dist_group *g, int root, void *buf, size_t bytes, char *err, size_t errlen) {
    if (g && (root < 0 || root >= g->size)) {
        set_err(err, errlen, "dist_broadcast: root %d is not a rank of a group of %d", root,
                g->size);
        return -1;
    }
    if (bytes && !buf) {
        set_err(err, errlen, "dist_broadcast: no buffer");
        return -1;
    }
    return guarded(g, "dist_broadcast", err, errlen, [&] {
        if (g->size == 1 || bytes == 0) return;
        auto key = std::make_pair(root, bytes);
        auto it = g->broadcasts.find(key);
        if (it == g->broadcasts.end()) {
            drop_cache_if_full(g, bytes);
            ScratchCollective sc;
            sc.scratch.resize(bytes);
            sc.algorithm = std::make_unique<gloo::BroadcastOneToAll<char>>(
                g->context, std::vector<char *>{sc.scratch.data()}, bytes, root);
            it = g->broadcasts.emplace(key, std::move(sc)).first;
            g->cached_objects++;
            g->cached_bytes += bytes;
        }
        if (g->rank == root) memcpy(it->second.scratch.data(), buf, bytes);
        it->second.algorithm->run();
        if (g->rank != root) memcpy(buf, it->second.scratch.data(), bytes);
    });
}

int dist_send(dist_group *g, int dst, const void *buf, size_t bytes, char *err, size_t errlen) {
    if (check_peer(g, dst, "dist_send", err, errlen) < 0) return -1;
    if (bytes && !buf) {
        set_err(err, errlen, "dist_send: no buffer");
        return -1;
    }
    return guarded(g, "dist_send", err, errlen, [&] {
        if (bytes == 0) return;
        g->credit_recv[dst]->waitRecv();
        if (g->credit_in[dst] != int64_t(bytes))
            throw gloo::InvalidOperationException("rank " + std::to_string(dst) + " waits for " +
                                                  std::to_string(g->credit_in[dst]) +
                                                  " bytes, this send has " + std::to_string(bytes) +
                                                  " (sizes must match on both ends)");
        auto &pair = g->context->getPair(dst);
        auto data =
            pair->createSendBuffer(p2p_data_slot(g->rank, dst), const_cast<void *>(buf), bytes);
        data->send();
        data->waitSend();
    });
}

int dist_recv(dist_group *g, int src, void *buf, size_t bytes, char *err, size_t errlen) {
    if (check_peer(g, src, "dist_recv", err, errlen) < 0) return -1;
    if (bytes && !buf) {
        set_err(err, errlen, "dist_recv: no buffer");
        return -1;
    }
    return guarded(g, "dist_recv", err, errlen, [&] {
        if (bytes == 0) return;
        auto &pair = g->context->getPair(src);
        /* Registered before the credit leaves, so the data always finds it. */
        auto data = pair->createRecvBuffer(p2p_data_slot(src, g->rank), buf, bytes);
        g->credit_out[src] = int64_t(bytes);
        g->credit_send[src]->send();
        g->credit_send[src]->waitSend();
        data->waitRecv();
    });
}

int dist_barrier(dist_group *g, char *err, size_t errlen) {
    return guarded(g, "dist_barrier", err, errlen, [&] {
        if (g->size > 1) g->barrier->run();
    });
}

/* ---- benchmark hooks (dist_internal.h) ---------------------------------------------------- */

const char *dist_allreduce_algorithm(const dist_group *g, size_t n) {
    if (!g || g->size == 1 || n == 0) return "none";
    switch (allreduce_algorithm(g, std::min(n, kMaxFloatsPerRun))) {
    case Algorithm::kDirect:
        return "direct";
    case Algorithm::kRing:
        return "ring";
    case Algorithm::kHalvingDoubling:
        break;
    }
    return "hd";
}

int dist_bench_bare_ring(dist_group *g, float *buf, size_t n, int iterations, double *seconds,
                         char *err, size_t errlen) {
    if (n == 0 || n > kMaxFloatsPerRun || iterations < 1) {
        set_err(err, errlen, "dist_bench_bare_ring: bad size or iteration count");
        return -1;
    }
    return guarded(g, "bare gloo ring", err, errlen, [&] {
        gloo::AllreduceRing<float> ring(g->context, std::vector<float *>{buf}, int(n));
        auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; i++)
            ring.run();
        *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
}

} // extern "C"
