// Multi-step attempts: the service-side helpers and the reconciler, with
// the filesystem blob store in a temporary directory, against a real server.
#include "messages_test_support.hpp"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <future>
#include <vector>

using namespace idem;
using namespace std::chrono_literals;
using idem_msg_test::count;
using idem_msg_test::dsn;
using idem_msg_test::query;

namespace {

namespace fs = std::filesystem;

class Reconciler : public ::testing::Test
{
protected:
    void SetUp() override
    {
        if (idem_test::base_dsn().empty())
            GTEST_SKIP() << "PG_IDEM_TEST_DSN is not set: integration test skipped";
        // Reconcilers with grace 0 take every live attempt: start empty.
        query("DELETE FROM idem_attempts");
        query("DELETE FROM idem_attempt_targets");
        query("DELETE FROM documents");
        char tmpl[] = "/tmp/idem_blobs.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        blobs_ = std::make_unique<filesystem_blob_store>(dir_, false);
        pool_ = std::make_unique<simple_pool>(dsn());
        conn_ = std::make_unique<pg::connection>(dsn());
    }
    void TearDown() override
    {
        if (!dir_.empty())
            fs::remove_all(dir_);
    }

    attempt_request doc(const std::string &body, bool declare = true)
    {
        attempt_request r;
        r.kind = "doc";
        r.target = "acct-7/reports";
        r.client_request_id = idem_test::unique_key("req");
        r.created_by = "alice";
        r.intent_json = R"({"title": "Q3"})";
        r.object_name = "q3 report.pdf";
        if (declare)
            r.declared_digest = sha256(body);
        return r;
    }

    // Opens a new attempt, checked.
    attempt_ref open(const attempt_request &r)
    {
        attempt_decision d = open_attempt(*conn_, r);
        EXPECT_EQ(d.decision, "new");
        return d.attempt(r);
    }

    void mark_stored(const attempt_ref &a, const std::string &body)
    {
        ASSERT_TRUE(conn_->exec("SELECT idem_attempt_store($1::uuid, $2, $3)", a.attempt_id,
                                a.generation, pg::as_bytea(to_bytes(sha256(body))))
                        .get_bool(0, 0));
    }

    std::string status(const attempt_ref &a)
    {
        pg::result r = conn_->exec("SELECT status, coalesce(failure_reason, '') FROM idem_attempts"
                                   " WHERE attempt_id = $1::uuid",
                                   a.attempt_id);
        const std::string reason = r.get_text(0, 1);
        return r.get_text(0, 0) + (reason.empty() ? "" : "(" + reason + ")");
    }

    long long documents(const attempt_ref &a)
    {
        return count("FROM documents WHERE attempt_id = $1::uuid", a.attempt_id);
    }

    // A reconciler over the temporary store with grace 0 and the document finalizer.
    std::unique_ptr<reconciler> make_reconciler(int batch = 100)
    {
        reconciler_settings s;
        s.grace = 0ms;
        s.batch = batch;
        s.retention = 0ms;
        s.log = [this](const std::string &line) {
            std::lock_guard<std::mutex> lk(log_mu_);
            log_.push_back(line);
        };
        auto r = std::make_unique<reconciler>(*pool_, *blobs_, s);
        r->set_finalizer("doc", insert_document());
        return r;
    }

    finalizer insert_document()
    {
        return [this](pg::transaction &tx, const attempt_ref &a) {
            finalized_++;
            tx.exec("INSERT INTO documents (attempt_id, object_key) VALUES ($1::uuid, $2)",
                    a.attempt_id, a.object_key);
            return promotion_event{};
        };
    }

    fs::path dir_;
    std::unique_ptr<filesystem_blob_store> blobs_;
    std::unique_ptr<simple_pool> pool_;
    std::unique_ptr<pg::connection> conn_;
    std::mutex log_mu_;
    std::vector<std::string> log_;
    std::atomic<int> finalized_{0};
};

}  // namespace

TEST_F(Reconciler, PromotesAttemptsWhoseBlobHasTheDeclaredDigest)
{
    const std::string body = "%PDF-1.7 quarterly numbers";
    // One the client stored and abandoned before promoting, one it uploaded
    // and abandoned before storing.
    attempt_request r1 = doc(body);
    attempt_ref stored = open(r1);
    ASSERT_EQ(blobs_->put_if_absent(stored.object_key, body), put_outcome::created);
    mark_stored(stored, body);
    attempt_request r2 = doc(body);
    attempt_ref pending = open(r2);
    ASSERT_EQ(blobs_->put_if_absent(pending.object_key, body), put_outcome::created);

    reconcile_report rep = make_reconciler()->reconcile_pass();
    EXPECT_EQ(rep.examined, 2u);
    EXPECT_EQ(rep.promoted, 2u);
    EXPECT_EQ(rep.errors, 0u);
    EXPECT_EQ(status(stored), "promoted");
    EXPECT_EQ(status(pending), "promoted");
    EXPECT_EQ(documents(stored), 1);
    EXPECT_EQ(documents(pending), 1);
    // Each promotion staged its event.
    EXPECT_EQ(count("FROM idem_outbox WHERE topic = 'doc.promoted' AND payload ->> 'attempt_id' = $1",
                    stored.attempt_id),
              1);
    // Its client's retry is answered from the decision table.
    EXPECT_EQ(open_attempt(*conn_, r1).decision, "promoted");
}

TEST_F(Reconciler, ReapsPendingAttemptsWithoutABlob)
{
    attempt_ref upload = open(doc("never uploaded"));
    attempt_request export_req = doc("", false);  // an export: no declared digest
    attempt_ref exported = open(export_req);
    reconcile_report rep = make_reconciler()->reconcile_pass();
    EXPECT_EQ(rep.reaped_no_blob, 2u);
    EXPECT_EQ(status(upload), "failed(reaped_no_blob)");
    EXPECT_EQ(status(exported), "failed(reaped_no_blob)");
    EXPECT_EQ(count("FROM idem_outbox WHERE topic = 'doc.failed' AND payload ->> 'attempt_id' = $1",
                    upload.attempt_id),
              1);
    EXPECT_EQ(finalized_.load(), 0);
}

TEST_F(Reconciler, WrongBlobFailsAPendingAttempt)
{
    attempt_ref a = open(doc("what the client declared"));
    ASSERT_EQ(blobs_->put_if_absent(a.object_key, "something else"), put_outcome::created);
    reconcile_report rep = make_reconciler()->reconcile_pass();
    EXPECT_EQ(rep.digest_mismatch, 1u);
    EXPECT_EQ(rep.promoted, 0u);
    EXPECT_EQ(status(a), "failed(digest_mismatch)");
    EXPECT_EQ(documents(a), 0);
}

TEST_F(Reconciler, StoredAttemptWithAChangedBlobIsNeverPromoted)
{
    const std::string body = "the real bytes";
    attempt_request req = doc(body);
    attempt_ref a = open(req);
    ASSERT_EQ(blobs_->put_if_absent(a.object_key, body), put_outcome::created);
    mark_stored(a, body);
    // The file changes behind the store's back (corruption, a rogue writer).
    std::ofstream(blobs_->path_of(a.object_key), std::ios::trunc) << "tampered";

    auto rec = make_reconciler();
    reconcile_report rep = rec->reconcile_pass();
    EXPECT_EQ(rep.left, 1u);
    EXPECT_EQ(rep.promoted, 0u);
    EXPECT_EQ(status(a), "stored");
    EXPECT_EQ(documents(a), 0);
    ASSERT_EQ(log_.size(), 1u);
    EXPECT_NE(log_[0].find("does not have the declared digest"), std::string::npos) << log_[0];
    // Nor by the service-side helper, with the attempt as its client's retry sees it.
    attempt_decision resumed = open_attempt(*conn_, req);
    EXPECT_EQ(resumed.decision, "resume");
    EXPECT_EQ(resumed.next_step, "promote");
    EXPECT_EQ(complete_attempt(*conn_, *blobs_, resumed.attempt(req), insert_document()),
              completion::digest_mismatch);
    // An out-of-date view of it (still pending) is stale: nothing is written.
    EXPECT_EQ(complete_attempt(*conn_, *blobs_, a, insert_document()), completion::stale);
    EXPECT_EQ(status(a), "stored");
    // And a missing blob is left the same way.
    blobs_->remove(a.object_key);
    EXPECT_EQ(rec->reconcile_pass().left, 1u);
    EXPECT_EQ(status(a), "stored");
}

TEST_F(Reconciler, GraceLeavesFreshAttemptsAlone)
{
    attempt_ref a = open(doc("in flight"));
    reconciler_settings s;  // grace 1 h
    reconciler rec(*pool_, *blobs_, s);
    EXPECT_EQ(rec.reconcile_pass().examined, 0u);
    EXPECT_EQ(status(a), "pending");
}

TEST_F(Reconciler, SweepDeletesAbandonedGenerationsAndPruneFinishedAttempts)
{
    const std::string body = "generation two is right";
    attempt_request req = doc(body);
    attempt_ref g1 = open(req);
    ASSERT_EQ(blobs_->put_if_absent(g1.object_key, "generation one was wrong"), put_outcome::created);
    auto rec = make_reconciler();
    ASSERT_EQ(rec->reconcile_pass().digest_mismatch, 1u);

    // The client retries: reopened under generation 2 and a new key.
    attempt_decision d = open_attempt(*conn_, req);
    ASSERT_EQ(d.decision, "reopened");
    attempt_ref g2 = d.attempt(req);
    EXPECT_EQ(g2.generation, 2);
    EXPECT_NE(g2.object_key, g1.object_key);
    ASSERT_EQ(blobs_->put_if_absent(g2.object_key, body), put_outcome::created);

    reconcile_report swept = rec->sweep_pass();
    EXPECT_EQ(swept.swept_keys, 1u);
    EXPECT_EQ(swept.swept_attempts, 1u);
    EXPECT_FALSE(blobs_->exists(g1.object_key));
    EXPECT_TRUE(blobs_->exists(g2.object_key));
    EXPECT_EQ(conn_->exec("SELECT swept_through FROM idem_attempts WHERE attempt_id = $1::uuid",
                          g2.attempt_id)
                  .get_int(0, 0),
              1);

    // The service finishes generation 2 itself; nothing is left to sweep.
    EXPECT_EQ(complete_attempt(*conn_, *blobs_, g2, insert_document()), completion::promoted);
    EXPECT_EQ(status(g2), "promoted");
    EXPECT_EQ(rec->sweep_pass().swept_keys, 0u);

    // Retention 0: the finished, swept attempt is pruned; its blob stays (it is the document).
    reconcile_report pruned = rec->prune_pass();
    EXPECT_EQ(pruned.pruned, 1u);
    EXPECT_EQ(count("FROM idem_attempts WHERE attempt_id = $1::uuid", g2.attempt_id), 0);
    EXPECT_TRUE(blobs_->exists(g2.object_key));
}

TEST_F(Reconciler, TwoReconcilersHandleEachAttemptOnce)
{
    constexpr int n = 40;
    std::vector<attempt_ref> attempts;
    for (int i = 0; i < n; ++i)
    {
        const std::string body = "blob " + std::to_string(i);
        attempts.push_back(open(doc(body)));
        ASSERT_EQ(blobs_->put_if_absent(attempts.back().object_key, body), put_outcome::created);
    }
    auto a = make_reconciler(5);
    auto b = make_reconciler(5);
    auto fa = std::async(std::launch::async, [&] { return a->reconcile_pass(); });
    auto fb = std::async(std::launch::async, [&] { return b->reconcile_pass(); });
    reconcile_report ra = fa.get(), rb = fb.get();
    EXPECT_EQ(ra.promoted + rb.promoted, static_cast<std::size_t>(n));
    EXPECT_EQ(ra.examined + rb.examined, static_cast<std::size_t>(n));
    EXPECT_EQ(ra.errors + rb.errors, 0u);
    EXPECT_EQ(ra.stale + rb.stale, 0u);
    EXPECT_EQ(finalized_.load(), n);
    EXPECT_EQ(query("SELECT count(*) FROM documents").get_int(0, 0), n);
    EXPECT_EQ(query("SELECT count(*) FROM idem_attempts WHERE status = 'promoted'").get_int(0, 0), n);
}

TEST_F(Reconciler, ServiceSideHelpersCompleteAnUpload)
{
    const std::string body = "uploaded by the service";
    attempt_request req = doc(body);
    attempt_ref a = open(req);
    EXPECT_EQ(complete_attempt(*conn_, *blobs_, a, insert_document()), completion::missing_blob);
    EXPECT_EQ(blobs_->put_if_absent(a.object_key, body), put_outcome::created);
    // A duplicate upload of the same key changes nothing.
    EXPECT_EQ(blobs_->put_if_absent(a.object_key, "late zombie upload"), put_outcome::exists);
    EXPECT_EQ(complete_attempt(*conn_, *blobs_, a, insert_document()), completion::promoted);
    EXPECT_EQ(documents(a), 1);
    // Completing it again is stale (and writes nothing).
    EXPECT_EQ(complete_attempt(*conn_, *blobs_, a, insert_document()), completion::stale);
    EXPECT_EQ(documents(a), 1);
    EXPECT_EQ(open_attempt(*conn_, req).decision, "promoted");

    // An export declares its digest when it is stored: the caller passes it.
    attempt_request ex = doc("", false);
    attempt_ref e = open(ex);
    ASSERT_EQ(blobs_->put_if_absent(e.object_key, "export bytes"), put_outcome::created);
    EXPECT_THROW(complete_attempt(*conn_, *blobs_, e, insert_document()), std::invalid_argument);
    EXPECT_EQ(complete_attempt(*conn_, *blobs_, e, insert_document(), sha256("export bytes")),
              completion::promoted);

    // Replace kinds flip the target's pointer; no finalizer needed.
    attempt_request av;
    av.kind = "avatar";
    av.target = "users/17";
    av.client_request_id = idem_test::unique_key("req");
    av.created_by = "alice";
    av.intent_json = "{}";
    av.object_name = "me.png";
    av.declared_digest = sha256("png");
    attempt_ref p = open(av);
    blobs_->put_if_absent(p.object_key, "png");
    EXPECT_EQ(complete_attempt(*conn_, *blobs_, p), completion::promoted);
    EXPECT_EQ(conn_->exec("SELECT idem_attempt_current('avatar', 'users/17')::text").get_text(0, 0),
              p.attempt_id);
}

TEST_F(Reconciler, ObjectKeysMatchTheServer)
{
    for (const char *name : {"report.pdf", "../../etc/passwd", "C:\\Users\\me\\My File (1).txt",
                             "..hidden", "a__b", "\xC3\xA9t\xC3\xA9.csv", "trailing...",
                             "x.tar.gz", "spaces in name", "emoji \xF0\x9F\x98\x80.png"})
        EXPECT_EQ(safe_object_name(name),
                  conn_->exec("SELECT idem_attempt_safe_name($1)", name).get_text(0, 0))
            << name;
    const std::string long_name = std::string(150, 'a') + ".json";
    EXPECT_EQ(safe_object_name(long_name),
              conn_->exec("SELECT idem_attempt_safe_name($1)", long_name).get_text(0, 0));
    const std::string long_ext = "b." + std::string(40, 'x');
    EXPECT_EQ(safe_object_name(long_ext + std::string(100, 'y')),
              conn_->exec("SELECT idem_attempt_safe_name($1)", long_ext + std::string(100, 'y'))
                  .get_text(0, 0));
    EXPECT_THROW(safe_object_name("..."), std::invalid_argument);
    EXPECT_THROW(conn_->exec("SELECT idem_attempt_safe_name('...')"), pg::invalid_parameter_value);

    attempt_request req = doc("x");
    attempt_ref a = open(req);
    EXPECT_EQ(object_key("docs", req.target, a.attempt_id, a.generation, req.object_name), a.object_key);
    EXPECT_THROW(object_key("docs", "../up", a.attempt_id, 1, "n"), std::invalid_argument);
}
