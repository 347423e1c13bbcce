// The local-filesystem blob store: conditional create with link(2).
#include <idem/blob_store.hpp>

#include <openssl/evp.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <random>
#include <stdexcept>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem {

namespace {

namespace fs = std::filesystem;

constexpr std::size_t max_object_key_bytes = 1024;
constexpr std::size_t read_chunk = 64 * 1024;

// Bytes allowed in an object key segment (as the server's check_path).
bool key_byte(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '-' || c == '_';
}

// The I/O error of the last system call, as the filesystem library reports them.
[[noreturn]] void throw_errno(const std::string &what, const fs::path &p)
{
    throw fs::filesystem_error(what, p, std::error_code(errno, std::generic_category()));
}

// Closes a descriptor once, whatever happens in between.
class fd_guard
{
public:
    explicit fd_guard(int fd) : fd_(fd) {}
    fd_guard(const fd_guard &) = delete;
    fd_guard &operator=(const fd_guard &) = delete;
    ~fd_guard()
    {
        if (fd_ >= 0)
            ::close(fd_);
    }
    int get() const noexcept { return fd_; }
    // Closes now and reports a failure (a deferred write error shows here).
    int close() noexcept
    {
        int rc = ::close(fd_);
        fd_ = -1;
        return rc;
    }

private:
    int fd_;
};

// Opens path read-only; -1 when it does not exist.
int open_for_read(const fs::path &p)
{
    int fd;
    do
        fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0 && errno != ENOENT && errno != ENOTDIR)
        throw_errno("cannot open blob", p);
    return fd;
}

// Calls sink(data, n) for every chunk of the file; false when it is absent.
template <typename Sink>
bool read_file(const fs::path &p, Sink &&sink)
{
    int raw = open_for_read(p);
    if (raw < 0)
        return false;
    fd_guard fd(raw);
    std::unique_ptr<char[]> buf(new char[read_chunk]);
    for (;;)
    {
        ssize_t n = ::read(fd.get(), buf.get(), read_chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            throw_errno("cannot read blob", p);
        if (n == 0)
            return true;
        sink(buf.get(), static_cast<std::size_t>(n));
    }
}

// write(2) until everything is written (short writes, EINTR).
void write_all(int fd, std::string_view bytes, const fs::path &p)
{
    while (!bytes.empty())
    {
        ssize_t n = ::write(fd, bytes.data(), bytes.size());
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            throw_errno("cannot write blob", p);
        bytes.remove_prefix(static_cast<std::size_t>(n));
    }
}

// fsync a directory, so that a link or an unlink in it survives a crash.
void sync_directory(const fs::path &dir)
{
    int raw = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (raw < 0)
        throw_errno("cannot open directory to sync it", dir);
    fd_guard fd(raw);
    if (::fsync(fd.get()) != 0 && errno != EINVAL)
        throw_errno("cannot sync directory", dir);
}

// A temporary name in dir that no object key can take ('~' is not a key byte).
fs::path temp_name(const fs::path &dir)
{
    static std::atomic<unsigned long> counter{0};
    thread_local std::mt19937_64 rng{std::random_device{}()};
    return dir / (".~put." + std::to_string(::getpid()) + "." + std::to_string(++counter) + "." +
                  std::to_string(rng()));
}

}  // namespace

void check_object_key(std::string_view key)
{
    if (key.empty() || key.size() > max_object_key_bytes)
        throw std::invalid_argument("object key must be 1 to 1024 bytes long");
    std::size_t start = 0;
    for (std::size_t i = 0; i <= key.size(); ++i)
    {
        if (i == key.size() || key[i] == '/')
        {
            std::string_view seg = key.substr(start, i - start);
            if (seg.empty() || seg == "." || seg == "..")
                throw std::invalid_argument("object key \"" + std::string(key) +
                                            "\" has an empty, \".\" or \"..\" segment");
            start = i + 1;
        }
        else if (!key_byte(key[i]))
            throw std::invalid_argument("object key \"" + std::string(key) +
                                        "\" has a byte outside [A-Za-z0-9._-/]");
    }
}

filesystem_blob_store::filesystem_blob_store(std::filesystem::path root, bool durable)
    : root_(std::move(root)), durable_(durable)
{
    if (root_.empty())
        throw std::invalid_argument("filesystem_blob_store: the root must not be empty");
    fs::create_directories(root_);
    root_ = fs::canonical(root_);
}

std::filesystem::path filesystem_blob_store::path_of(const std::string &key) const
{
    check_object_key(key);
    return root_ / fs::path(key);
}

put_outcome filesystem_blob_store::put_if_absent(const std::string &key, std::string_view bytes)
{
    const fs::path target = path_of(key);
    const fs::path dir = target.parent_path();
    if (fs::exists(target))
        return put_outcome::exists;
    fs::create_directories(dir);

    const fs::path tmp = temp_name(dir);
    int raw = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (raw < 0)
        throw_errno("cannot create temporary blob", tmp);
    fd_guard fd(raw);
    // The temporary file goes whatever happens; the link keeps the data.
    struct unlink_guard
    {
        const fs::path &p;
        ~unlink_guard() { ::unlink(p.c_str()); }
    } remove_tmp{tmp};

    write_all(fd.get(), bytes, tmp);
    if (durable_ && ::fsync(fd.get()) != 0)
        throw_errno("cannot sync blob", tmp);
    if (fd.close() != 0)
        throw_errno("cannot close blob", tmp);

    // link(2) never replaces an existing file: the conditional create.
    if (::link(tmp.c_str(), target.c_str()) != 0)
    {
        if (errno == EEXIST)
            return put_outcome::exists;
        throw_errno("cannot publish blob", target);
    }
    if (durable_)
        sync_directory(dir);
    return put_outcome::created;
}

std::optional<digest> filesystem_blob_store::digest_of(const std::string &key)
{
    struct ctx_free
    {
        void operator()(EVP_MD_CTX *c) const noexcept { EVP_MD_CTX_free(c); }
    };
    std::unique_ptr<EVP_MD_CTX, ctx_free> ctx(EVP_MD_CTX_new());
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
        throw std::runtime_error("OpenSSL: cannot initialise SHA-256");
    const bool found = read_file(path_of(key), [&](const char *p, std::size_t n) {
        if (EVP_DigestUpdate(ctx.get(), p, n) != 1)
            throw std::runtime_error("OpenSSL: SHA-256 update failed");
    });
    if (!found)
        return std::nullopt;
    digest d{};
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx.get(), d.data(), &len) != 1 || len != d.size())
        throw std::runtime_error("OpenSSL: SHA-256 final failed");
    return d;
}

std::optional<std::string> filesystem_blob_store::get(const std::string &key)
{
    std::string out;
    if (!read_file(path_of(key), [&](const char *p, std::size_t n) { out.append(p, n); }))
        return std::nullopt;
    return out;
}

bool filesystem_blob_store::exists(const std::string &key)
{
    struct stat st;
    const fs::path p = path_of(key);
    if (::stat(p.c_str(), &st) == 0)
        return true;
    if (errno == ENOENT || errno == ENOTDIR)
        return false;
    throw_errno("cannot stat blob", p);
}

bool filesystem_blob_store::remove(const std::string &key)
{
    const fs::path p = path_of(key);
    if (::unlink(p.c_str()) != 0)
    {
        if (errno == ENOENT || errno == ENOTDIR)
            return false;
        throw_errno("cannot remove blob", p);
    }
    if (durable_)
        sync_directory(p.parent_path());
    return true;
}

}  // namespace idem
