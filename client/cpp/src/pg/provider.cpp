// The built-in connection pool.
#include <idem/provider.hpp>

#include <mutex>
#include <vector>

namespace idem {

struct simple_pool::state
{
    std::mutex mu;
    std::vector<std::unique_ptr<pg::connection>> idle;
    std::size_t max_idle = 0;
};

simple_pool::simple_pool(std::string conninfo, std::size_t max_idle)
    : conninfo_(std::move(conninfo)), state_(std::make_shared<state>())
{
    state_->max_idle = max_idle;
}

connection_handle simple_pool::acquire()
{
    std::unique_ptr<pg::connection> c;
    {
        std::lock_guard<std::mutex> lk(state_->mu);
        while (!state_->idle.empty() && !c)
        {
            c = std::move(state_->idle.back());
            state_->idle.pop_back();
            if (!c->is_open() || c->status() != pg::transaction_status::idle)
                c.reset();
        }
    }
    if (!c)
        c = std::make_unique<pg::connection>(conninfo_);
    std::weak_ptr<state> weak = state_;
    return connection_handle(std::move(c), [weak](std::unique_ptr<pg::connection> back) {
        auto s = weak.lock();
        if (!s || !back->is_open() || back->status() != pg::transaction_status::idle)
            return;  // closed by the unique_ptr
        std::lock_guard<std::mutex> lk(s->mu);
        if (s->idle.size() < s->max_idle)
            s->idle.push_back(std::move(back));
    });
}

std::size_t simple_pool::idle() const
{
    std::lock_guard<std::mutex> lk(state_->mu);
    return state_->idle.size();
}

}  // namespace idem
