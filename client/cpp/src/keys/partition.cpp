// pg_idem C++ client: the partition map and hash of the PL/Proxy router,
// mirrored (tests/scaleout/router.sql defines them; the scaleout suite
// checks that both agree on many keys).
#include <idem/partition.hpp>

#include <cstdlib>
#include <stdexcept>

namespace idem {

std::int32_t partition_hash(std::string_view bytes) noexcept
{
    if (bytes.size() < 4)
        return 0;
    const auto b = [&](std::size_t i) { return static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])); };
    return static_cast<std::int32_t>((b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3));
}

std::int32_t inbox_hash(std::string_view consumer, std::string_view message_id)
{
    // SHA-256(uint32_be(len(consumer)) || consumer || message_id).
    std::string buf;
    buf.reserve(4 + consumer.size() + message_id.size());
    const auto n = static_cast<std::uint32_t>(consumer.size());
    buf.push_back(static_cast<char>(n >> 24));
    buf.push_back(static_cast<char>(n >> 16));
    buf.push_back(static_cast<char>(n >> 8));
    buf.push_back(static_cast<char>(n));
    buf.append(consumer);
    buf.append(message_id);
    return partition_hash(sha256(buf));
}

std::int32_t text_hash(std::string_view value) { return partition_hash(sha256(value)); }

partition_map::partition_map(std::vector<std::string> conninfos, bool modular)
    : conninfos_(std::move(conninfos)), modular_(modular)
{
    const std::size_t n = conninfos_.size();
    if (n == 0)
        throw std::runtime_error("the partition map has no partitions");
    if (!modular_ && (n & (n - 1)) != 0)
        throw std::runtime_error("the partition map has " + std::to_string(n) +
                                 " partitions: PL/Proxy's bitmask mapping needs a power of 2");
}

partition_map partition_map::load(pg::connection &router)
{
    pg::result r = router.exec(
        "SELECT partition, conninfo, partitions, modular FROM idem_partition_map() ORDER BY partition");
    if (r.empty())
        throw std::runtime_error("the router has no partitions (no SQL/MED server \"idem\")");
    std::vector<std::string> conninfos;
    for (std::size_t i = 0; i < r.size(); ++i)
    {
        if (r.get_int(i, 0) != static_cast<std::int64_t>(i))
            throw std::runtime_error("the router's partitions are not numbered 0.." +
                                     std::to_string(r.size() - 1));
        conninfos.push_back(r.get_text(i, 1));
    }
    return partition_map(std::move(conninfos), r.get_bool(0, 3));
}

std::size_t partition_map::partition_of_hash(std::int32_t hash) const noexcept
{
    const auto n = static_cast<std::int64_t>(conninfos_.size());
    if (modular_)
        return static_cast<std::size_t>(std::llabs(static_cast<std::int64_t>(hash) % n));
    return static_cast<std::size_t>(static_cast<std::uint32_t>(hash) & static_cast<std::uint32_t>(n - 1));
}

partitioned_pool::partitioned_pool(partition_map map, std::string extra_conninfo, std::size_t max_idle)
    : map_(std::move(map))
{
    for (std::size_t i = 0; i < map_.size(); ++i)
    {
        std::string conninfo = map_.conninfo(i);
        if (!extra_conninfo.empty())
            conninfo += " " + extra_conninfo;
        pools_.push_back(std::make_unique<simple_pool>(std::move(conninfo), max_idle));
    }
}

partitioned_pool partitioned_pool::from_router(const std::string &router_conninfo,
                                               std::string extra_conninfo, std::size_t max_idle)
{
    pg::connection router(router_conninfo);
    return partitioned_pool(partition_map::load(router), std::move(extra_conninfo), max_idle);
}

connection_provider *partitioned_pool::for_request(const request_view &req, std::string_view key_namespace)
{
    if (check_key_header(req.idempotency_keys) != key_status::ok)
        return nullptr;
    return &for_key(cache_key(req.principal, req.method, protocol::namespaced_target(key_namespace, req.target),
                              req.idempotency_keys.front()));
}

partitioned_runner::partitioned_runner(partitioned_pool &pools, config cfg, metrics *observer)
    : pools_(&pools), key_namespace_(cfg.key_namespace())
{
    for (std::size_t i = 0; i < pools.map().size(); ++i)
        runners_.emplace_back(pools.partition(i), cfg, observer);
}

std::size_t partitioned_runner::partition_of(const request_view &req) const
{
    if (check_key_header(req.idempotency_keys) != key_status::ok)
        return 0;
    return pools_->map().partition_of(cache_key(req.principal, req.method,
                                                protocol::namespaced_target(key_namespace_, req.target),
                                                req.idempotency_keys.front()));
}

run_result partitioned_runner::run(const request_view &req, const handler &h) const
{
    return runners_[partition_of(req)].run(req, h);
}

run_result partitioned_runner::run_fenced(const request_view &req, const transaction_handler &h,
                                          pg::isolation level) const
{
    return runners_[partition_of(req)].run_fenced(req, h, level);
}

run_result partitioned_runner::run_in_transaction(const request_view &req, const transaction_handler &h,
                                                  pg::isolation level) const
{
    return runners_[partition_of(req)].run_in_transaction(req, h, level);
}

}  // namespace idem
