// Internal header of the libpq wrappers (not installed): what pg.cpp and
// pipeline.cpp both hand to libpq.
#pragma once

#include <idem/pg.hpp>

#include <libpq-fe.h>

#include <string>
#include <string_view>
#include <vector>

namespace idem::pg::detail {

// The parameter arrays libpq takes, pointing into params.
struct wire_params
{
    std::vector<Oid> types;
    std::vector<const char *> values;
    std::vector<int> lengths, formats;

    explicit wire_params(const std::vector<param> &params)
    {
        types.reserve(params.size());
        values.reserve(params.size());
        lengths.reserve(params.size());
        formats.reserve(params.size());
        for (const param &p : params)
        {
            types.push_back(p.type());
            values.push_back(p.is_null() ? nullptr : p.value().data());
            lengths.push_back(p.is_null() ? 0 : static_cast<int>(p.value().size()));
            formats.push_back(static_cast<int>(p.wire_format()));
        }
    }
    int count() const { return static_cast<int>(types.size()); }
};

// The cache key of a named statement: its text and its parameter types
// (a name is bound to the types it was parsed with).
inline std::string statement_key(std::string_view sql, const std::vector<param> &params)
{
    std::string key(sql);
    key.push_back('\0');
    for (const param &p : params)
        key += std::to_string(p.type()) + ",";
    return key;
}

}  // namespace idem::pg::detail
