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

#include <cstddef>
#include <functional>
#include <memory>
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
    // Throws (e.g. pg::broken_connection) when none can be had.
    virtual connection_handle acquire() = 0;
};

// A minimal thread-safe pool: keeps up to max_idle idle connections and
// opens new ones on demand (no upper bound: bound concurrency upstream).
// Broken connections and ones returned inside a transaction are closed.
class simple_pool : public connection_provider
{
public:
    explicit simple_pool(std::string conninfo, std::size_t max_idle = 8);
    connection_handle acquire() override;
    std::size_t idle() const;

private:
    struct state;
    std::string conninfo_;
    std::shared_ptr<state> state_;  // outlives the pool while handles are out
};

}  // namespace idem
