// pg_idem C++ client: retrying transactions (libpqxx transactor style).
//
//   int n = idem::transact(pool, [&](idem::pg::transaction &tx) {
//       return tx.exec("UPDATE account SET n = n + 1 RETURNING n").get_int(0, 0);
//   });
//
// A serialization failure (40001) or deadlock (40P01) rolls the attempt
// back and runs it again, up to `attempts` times; so does a connection lost
// before COMMIT was sent (the transaction died with it). A connection lost
// while COMMIT was in flight (pg::unknown_outcome) is never retried: the
// work may have committed, so the caller must find out by reading.
#pragma once

#include <idem/pg.hpp>
#include <idem/provider.hpp>

#include <chrono>
#include <thread>
#include <type_traits>
#include <utility>

namespace idem {

struct retry_policy
{
    unsigned attempts = 3;
    // Pause before attempt n is backoff * (n - 1).
    std::chrono::milliseconds backoff{5};
};

namespace detail {
// True when attempt `attempt` (1-based) of `policy` may be followed by another.
inline bool may_retry(const retry_policy &policy, unsigned attempt)
{
    if (attempt >= policy.attempts)
        return false;
    std::this_thread::sleep_for(policy.backoff * attempt);
    return true;
}
}  // namespace detail

// Runs body() until it returns, retrying the transient failures above. body
// must open its own transaction (and, for a broken connection to be worth
// retrying, its own connection).
template <typename F>
auto perform(F &&body, retry_policy policy = {}) -> decltype(body())
{
    for (unsigned attempt = 1;; ++attempt)
    {
        try
        {
            return body();
        }
        catch (const pg::unknown_outcome &)
        {
            throw;  // may have committed: running it again could do it twice
        }
        catch (const pg::serialization_failure &)
        {
            if (!detail::may_retry(policy, attempt))
                throw;
        }
        catch (const pg::deadlock_detected &)
        {
            if (!detail::may_retry(policy, attempt))
                throw;
        }
        catch (const pg::broken_connection &)
        {
            if (!detail::may_retry(policy, attempt))
                throw;
        }
    }
}

// Takes a connection from provider, runs body(tx) in a transaction and
// commits it, with perform()'s retries. Returns what body returns.
template <typename F>
auto transact(connection_provider &provider, F &&body, retry_policy policy = {},
              pg::isolation level = pg::isolation::read_committed)
    -> decltype(body(std::declval<pg::transaction &>()))
{
    return perform(
        [&]() -> decltype(body(std::declval<pg::transaction &>())) {
            connection_handle conn = provider.acquire();
            pg::transaction tx(*conn, level);
            if constexpr (std::is_void_v<decltype(body(tx))>)
            {
                body(tx);
                tx.commit();
            }
            else
            {
                auto out = body(tx);
                tx.commit();
                return out;
            }
        },
        policy);
}

}  // namespace idem
