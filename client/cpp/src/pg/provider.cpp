// The built-in connection pool: unbounded by default, or bounded with a
// fair (first come, first served) wait that ends in idem::pool_exhausted.
#include <idem/error.hpp>
#include <idem/provider.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

namespace idem {

struct simple_pool::state
{
    std::mutex mu;
    std::condition_variable freed;
    std::vector<std::unique_ptr<pg::connection>> idle;
    std::deque<const void *> waiting;  // the turns of bounded waits, in order
    std::size_t out = 0;               // connections given out (bounded pools)
    simple_pool::options opts;
};

simple_pool::simple_pool(std::string conninfo, std::size_t max_idle)
    : simple_pool(std::move(conninfo), options{max_idle, 0, protocol::pool_wait})
{
}

simple_pool::simple_pool(std::string conninfo, options o)
    : conninfo_(std::move(conninfo)), state_(std::make_shared<state>())
{
    state_->opts = o;
}

connection_handle simple_pool::acquire() { return acquire_within(state_->opts.wait); }

connection_handle simple_pool::acquire_within(std::chrono::milliseconds within)
{
    state &s = *state_;
    const bool bounded = s.opts.max_size > 0;
    const auto wait = std::min(within, s.opts.wait);
    std::unique_ptr<pg::connection> c;
    {
        std::unique_lock<std::mutex> lk(s.mu);
        if (bounded)
        {
            // Wait for this request's turn and a free place.
            const int me = 0;
            s.waiting.push_back(&me);
            const bool ok = s.freed.wait_for(lk, wait, [&] {
                return s.waiting.front() == &me && s.out < s.opts.max_size;
            });
            s.waiting.erase(std::find(s.waiting.begin(), s.waiting.end(), &me));
            s.freed.notify_all();  // the next in turn looks again
            if (!ok)
                throw pool_exhausted("pg_idem: no connection of the pool (max_size " +
                                     std::to_string(s.opts.max_size) + ") came free within " +
                                     std::to_string(wait.count()) + " ms");
            ++s.out;
        }
        while (!s.idle.empty() && !c)
        {
            c = std::move(s.idle.back());
            s.idle.pop_back();
            if (!c->is_open() || c->status() != pg::transaction_status::idle)
                c.reset();
        }
    }
    std::weak_ptr<state> weak = state_;
    auto give_back = [weak, bounded](std::unique_ptr<pg::connection> back) {
        auto st = weak.lock();
        if (!st)
            return;  // the pool is gone: closed by the unique_ptr
        std::lock_guard<std::mutex> lk(st->mu);
        if (bounded)
        {
            --st->out;
            st->freed.notify_all();
        }
        if (back && back->is_open() && back->status() == pg::transaction_status::idle &&
            st->idle.size() < st->opts.max_idle)
            st->idle.push_back(std::move(back));
    };
    if (!c)
    {
        try
        {
            c = std::make_unique<pg::connection>(conninfo_);
        }
        catch (...)
        {
            give_back(nullptr);  // its place is free again
            throw;
        }
    }
    return connection_handle(std::move(c), std::move(give_back));
}

std::optional<std::size_t> simple_pool::capacity() const
{
    if (state_->opts.max_size == 0)
        return std::nullopt;
    return state_->opts.max_size;
}

std::size_t simple_pool::idle() const
{
    std::lock_guard<std::mutex> lk(state_->mu);
    return state_->idle.size();
}

}  // namespace idem
