// pg_idem C++ client: where multi-step attempts keep their blobs.
//
// A blob_store is the object store an attempt uploads to (S3, GCS, a
// directory...). The attempt protocol needs three properties of it:
//
//   * put_if_absent never overwrites: a late or duplicate upload of a key
//     that exists changes nothing (S3: If-None-Match: *);
//   * digest_of reads the stored bytes back and hashes them (SHA-256), so
//     a promotion is decided on what the store holds, never on the bare
//     existence of a key or on what the uploader meant to write;
//   * remove deletes a key; removing an absent key is not an error (the
//     sweeper may run twice over the same key).
//
// filesystem_blob_store implements it on a local directory; implement the
// interface for your own store.
#pragma once

#include <idem/key.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace idem {

// What put_if_absent did.
enum class put_outcome
{
    created,  // the key did not exist; it now holds the bytes
    exists    // the key already existed; nothing was written
};

class blob_store
{
public:
    virtual ~blob_store() = default;
    // Creates key holding bytes unless the key exists; never overwrites.
    virtual put_outcome put_if_absent(const std::string &key, std::string_view bytes) = 0;
    // SHA-256 of the bytes stored under key, read back from the store;
    // nullopt when the key does not exist.
    virtual std::optional<digest> digest_of(const std::string &key) = 0;
    // The bytes stored under key, nullopt when absent.
    virtual std::optional<std::string> get(const std::string &key) = 0;
    virtual bool exists(const std::string &key) = 0;
    // Deletes key; false when it did not exist.
    virtual bool remove(const std::string &key) = 0;
};

// Throws std::invalid_argument unless key is an object key as pg_idem
// builds them: at most 1024 bytes, segments of [A-Za-z0-9._-] joined by
// '/', none empty, "." or "..". Such a key is also a safe relative path.
void check_object_key(std::string_view key);

// Blobs as files under a root directory: key "a/b/c" is root/a/b/c.
//
// put_if_absent writes a temporary file (O_CREAT | O_EXCL, a name no
// object key can have), fsyncs it, and publishes it with link(2), which
// fails with EEXIST instead of replacing an existing file; the directory
// is fsynced after the link and after a remove. Readers therefore never
// see a partial blob, and two concurrent puts of one key leave exactly one
// of them (the first link wins). Thread and process safe. I/O errors are
// std::filesystem::filesystem_error; a malformed key is
// std::invalid_argument.
class filesystem_blob_store final : public blob_store
{
public:
    // Creates root if needed. durable = false skips the fsyncs (tests).
    explicit filesystem_blob_store(std::filesystem::path root, bool durable = true);

    put_outcome put_if_absent(const std::string &key, std::string_view bytes) override;
    std::optional<digest> digest_of(const std::string &key) override;
    std::optional<std::string> get(const std::string &key) override;
    bool exists(const std::string &key) override;
    bool remove(const std::string &key) override;

    // Where key lives (after check_object_key).
    std::filesystem::path path_of(const std::string &key) const;
    const std::filesystem::path &root() const noexcept { return root_; }

private:
    std::filesystem::path root_;
    bool durable_;
};

}  // namespace idem
