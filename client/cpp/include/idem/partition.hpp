// pg_idem C++ client: route a request to the partition that owns its key.
//
// With pg_idem sharded on PL/Proxy (tests/scaleout/router.sql), every call
// through the router runs in its own autocommit transaction on one
// partition. Lease mode works through the router; fenced and
// in-transaction modes need the handler's writes and the finalize on the
// owning partition's server, so the client connects there itself. The
// partition map is read from the router (idem_partition_map(), i.e. the
// SQL/MED server PL/Proxy uses), and the hash is the router's
// idem_partition_hash(): the first 4 bytes of the SHA-256 cache key as a
// big-endian int4, mapped as PL/Proxy maps it (hash & (n - 1), or
// abs(hash % n) with modular_mapping).
//
//   auto pools = idem::partitioned_pool::from_router("host=router dbname=app",
//                                                    "user=svc password=...");
//   idem::partitioned_runner run(pools, cfg);
//   run.run_in_transaction(req, handler);   // on the partition that owns req's key
#pragma once

#include <idem/config.hpp>
#include <idem/http.hpp>
#include <idem/key.hpp>
#include <idem/pg.hpp>
#include <idem/provider.hpp>
#include <idem/runner.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

// The router's idem_partition_hash(): the first 4 bytes, big-endian, as a
// signed int4 (0 for fewer than 4 bytes).
std::int32_t partition_hash(std::string_view bytes) noexcept;
inline std::int32_t partition_hash(const digest &d) noexcept
{
    return partition_hash(std::string_view(reinterpret_cast<const char *>(d.data()), d.size()));
}
// The router's idem_inbox_hash(consumer, message_id).
std::int32_t inbox_hash(std::string_view consumer, std::string_view message_id);
// The router's idem_partition_text_hash(value): outbox keys, attempt targets.
std::int32_t text_hash(std::string_view value);

// The partitions of the router's cluster, in partition order.
class partition_map
{
public:
    partition_map() = default;
    partition_map(std::vector<std::string> conninfos, bool modular);
    // SELECT * FROM idem_partition_map() on the router; throws
    // std::runtime_error when the router has no partitions, or a count
    // PL/Proxy's bitmask mapping cannot use.
    static partition_map load(pg::connection &router);

    std::size_t size() const noexcept { return conninfos_.size(); }
    bool modular() const noexcept { return modular_; }
    const std::string &conninfo(std::size_t partition) const { return conninfos_.at(partition); }

    // The partition a hash maps to, exactly as PL/Proxy maps it.
    std::size_t partition_of_hash(std::int32_t hash) const noexcept;
    std::size_t partition_of(const digest &cache_key) const noexcept
    {
        return partition_of_hash(partition_hash(cache_key));
    }
    std::size_t partition_of_message(std::string_view consumer, std::string_view message_id) const
    {
        return partition_of_hash(inbox_hash(consumer, message_id));
    }
    std::size_t partition_of_text(std::string_view value) const
    {
        return partition_of_hash(text_hash(value));
    }

private:
    std::vector<std::string> conninfos_;
    bool modular_ = false;
};

// One simple_pool per partition. The conninfos are the router's (how the
// router reaches each partition); extra_conninfo is appended to each, so a
// client adds its own user, password or host override (later libpq
// keywords win).
class partitioned_pool
{
public:
    explicit partitioned_pool(partition_map map, std::string extra_conninfo = "",
                              std::size_t max_idle = 8);
    static partitioned_pool from_router(const std::string &router_conninfo,
                                        std::string extra_conninfo = "", std::size_t max_idle = 8);

    const partition_map &map() const noexcept { return map_; }
    // The provider of one partition's connections.
    connection_provider &partition(std::size_t i) { return *pools_.at(i); }
    // The provider of the partition that owns a cache key.
    connection_provider &for_key(const digest &cache_key) { return partition(map_.partition_of(cache_key)); }
    // The partition of a request's key (the principal, method, target and
    // key of idem_key(); key_namespace: the runner's, if it has one);
    // nullptr when the request has no valid key, which a runner then
    // answers (400) or runs unguarded without a claim.
    connection_provider *for_request(const request_view &req, std::string_view key_namespace = {});

private:
    partition_map map_;
    std::vector<std::unique_ptr<simple_pool>> pools_;
};

// One runner per partition, each on its partition's pool: run,
// run_fenced and run_in_transaction go to the partition that owns the
// request's key, so the handler's writes and the finalize commit on one
// server. A request without a valid key goes to partition 0's runner,
// which answers it as a single-server runner does (never claims).
class partitioned_runner
{
public:
    explicit partitioned_runner(partitioned_pool &pools, config cfg = config(),
                                metrics *observer = nullptr);

    run_result run(const request_view &req, const handler &h) const;
    run_result run_fenced(const request_view &req, const transaction_handler &h,
                          pg::isolation level = pg::isolation::read_committed) const;
    run_result run_in_transaction(const request_view &req, const transaction_handler &h,
                                  pg::isolation level = pg::isolation::read_committed) const;
    // The partition a request is routed to.
    std::size_t partition_of(const request_view &req) const;
    const runner &for_partition(std::size_t i) const { return runners_.at(i); }

private:
    partitioned_pool *pools_;
    std::vector<runner> runners_;
    std::string key_namespace_;  // the config's: part of the key a partition is chosen by
};

}  // namespace idem
