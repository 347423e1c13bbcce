// pg_idem C++ client: where the runner gets its connections.
//
// The application supplies a connection_provider (usually its pool). The
// runner acquires a connection for the claim and the lease renewal, and,
// in run_fenced, another for the handler's transaction. A
// connection_handle gives the connection back when destroyed; the runner
// always returns connections idle, outside any transaction, holding no
// locks and with no session setting changed.
#pragma once

#include <idem/pg.hpp>
#include <idem/protocol.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace idem {

// A borrowed connection; move-only. The release function is called once,
// from the destructor.
class connection_handle
{
public:
    using release_fn = std::function<void(std::unique_ptr<pg::connection>)>;

    connection_handle() = default;
    connection_handle(std::unique_ptr<pg::connection> conn, release_fn release)
        : conn_(std::move(conn)), release_(std::move(release))
    {
    }
    connection_handle(connection_handle &&) noexcept = default;
    connection_handle &operator=(connection_handle &&other) noexcept
    {
        if (this != &other)
        {
            reset();
            conn_ = std::move(other.conn_);
            release_ = std::move(other.release_);
        }
        return *this;
    }
    ~connection_handle() { reset(); }

    pg::connection &operator*() const { return *conn_; }
    pg::connection *operator->() const { return conn_.get(); }
    explicit operator bool() const noexcept { return conn_ != nullptr; }

    // Gives the connection back now.
    void reset() noexcept
    {
        if (conn_ && release_)
            release_(std::move(conn_));
        conn_.reset();
        release_ = nullptr;
    }

private:
    std::unique_ptr<pg::connection> conn_;
    release_fn release_;
};

// An application with its own libpq pool wraps its PGconn with
// pg::connection::adopt() and, in the release function, takes it back with
// pg::connection::release().
class connection_provider
{
public:
    virtual ~connection_provider() = default;
    // A connection for the caller's exclusive use until the handle dies.
    // Throws (e.g. pg::broken_connection) when none can be had; a bounded
    // provider whose connections are all out throws idem::pool_exhausted
    // once it has waited as long as it waits.
    virtual connection_handle acquire() = 0;
    // The same, waiting at most `within` for a bounded provider (the
    // runner asks so for a waiting duplicate's next round, bounded by its
    // wait budget). By default: acquire().
    virtual connection_handle acquire_within(std::chrono::milliseconds within)
    {
        (void)within;
        return acquire();
    }
    // How many connections it gives out at most, if it is bounded: waiting
    // duplicates then hold at most their share of them
    // (protocol::pool_duplicates_share) and hand theirs back between wait
    // slices, so that they cannot take the pool from the requests that
    // would run. std::nullopt: no bound the runner knows of.
    virtual std::optional<std::size_t> capacity() const { return std::nullopt; }
};

// A minimal thread-safe pool: keeps up to max_idle idle connections and
// opens new ones on demand. Without max_size there is no upper bound
// (bound concurrency upstream, or the server's max_connections is met);
// with it, at most max_size connections are out, and acquire() waits its
// turn (first come, first served) up to `wait`, then throws
// idem::pool_exhausted. A request holds one connection at a time, two in
// run_fenced(): size a bounded pool for that. Broken connections and ones
// returned inside a transaction are closed.
class simple_pool : public connection_provider
{
public:
    struct options
    {
        std::size_t max_idle = 8;
        std::size_t max_size = 0;  // 0: no bound
        std::chrono::milliseconds wait = protocol::pool_wait;
    };

    explicit simple_pool(std::string conninfo, std::size_t max_idle = 8);
    simple_pool(std::string conninfo, options o);
    connection_handle acquire() override;
    connection_handle acquire_within(std::chrono::milliseconds within) override;
    std::optional<std::size_t> capacity() const override;
    std::size_t idle() const;

private:
    struct state;
    std::string conninfo_;
    std::shared_ptr<state> state_;  // outlives the pool while handles are out
};

}  // namespace idem
