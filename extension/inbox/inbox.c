/*-------------------------------------------------------------------------
 *
 * inbox.c
 *	  The message inbox: exactly-once processing of delivered messages,
 *	  with a hard cap on attempts and dead letters staged in the outbox.
 *
 * One row per (consumer, message_id), keyed by a SHA-256 of the two
 * length-delimited strings, so that no caller-controlled string reaches
 * the index.
 *
 * idem_inbox_begin runs in the consumer's transaction.  It inserts the
 * row, or takes a failed one over, with state = 'processing'; that write
 * holds the row until the consumer's transaction ends, so concurrent
 * deliveries of the same message wait on it (ON CONFLICT waits for an
 * in-flight inserter, an UPDATE for an in-flight updater) and then see
 * the outcome: done (duplicate), or rolled back (they process).  The
 * handler's effects and idem_inbox_done commit together; the deferred
 * constraint trigger idem_inbox_message_done refuses to commit a
 * transaction in which a begun message is still 'processing'.
 *
 * The attempt cap.  Everything begin writes rolls back with a failed
 * attempt, so a failure has to be recorded by a transaction that commits
 * on its own.  Until it is, the attempt holds its message's entry in a
 * registry in shared memory (inbox_registry.c), so that concurrent
 * deliveries never start from a count that misses it; inbox_cap.c keeps
 * this backend's attempts and the paths that could lose one, and
 * inbox_failure.c has the one recording statement.  The writers:
 * idem_inbox_fail (after the rollback, or after ROLLBACK TO a savepoint
 * taken after begin); the consumer's own backend for an attempt that
 * aborted and was never recorded (at exit); begin, which writes the
 * failures a session handed over before it decides, and refuses to run a
 * message whose error_count has reached max_attempts (marking it dead);
 * and the cleanup worker, for failures handed over and not delivered
 * again.
 *
 * Messages are scoped per role like keys (scope.c): a consumer sees only
 * its role's messages, plus those from before 0.3.0 (the shared scope).
 *
 * Reaching the cap marks the message dead and stages a dead-letter event
 * (topic idem.inbox.dead) in the outbox, in the same transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/errors.h"
#include "core/hashing.h"
#include "core/schema.h"
#include "core/scope.h"
#include "core/settings.h"
#include "core/statements.h"
#include "core/stats.h"
#include "inbox/inbox.h"

#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "storage/ipc.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(idem_inbox_begin);
PG_FUNCTION_INFO_V1(idem_inbox_done);
PG_FUNCTION_INFO_V1(idem_inbox_fail);
PG_FUNCTION_INFO_V1(idem_inbox_retry);
PG_FUNCTION_INFO_V1(idem_inbox_prune);
PG_FUNCTION_INFO_V1(idem_inbox_message_done);

#define PRUNE_MAX_BATCH			1000000

/* How often begin re-reads a message that changed under it. */
#define BEGIN_MAX_ROUNDS		16

/* Domain tag of the inbox key, distinct from idem_key's. */
static const char inbox_domain[] = "pg_idem inbox v1";

static IdemStatement insert_message = {
	"INSERT INTO @extschema@.idem_inbox"
	" (inbox_key, consumer, message_id, payload_hash, state, max_attempts,"
	"  received_at, attempt_started_at, scope)"
	" VALUES ($1, $2, $3, $4, 'processing', $5, clock_timestamp(), clock_timestamp(), $6)"
	" ON CONFLICT (inbox_key, scope) DO NOTHING"
	" RETURNING error_count",
	6, {BYTEAOID, TEXTOID, TEXTOID, BYTEAOID, INT4OID, OIDOID}
};

/* Take a failed message over; the predicate re-states begin's decision. */
static IdemStatement start_attempt = {
	"UPDATE @extschema@.idem_inbox"
	" SET state = 'processing', attempt_started_at = clock_timestamp(),"
	"  max_attempts = $3, payload_hash = coalesce(payload_hash, $2)"
	" WHERE inbox_key = $1 AND scope = $4 AND state = 'failed'"
	"  AND (payload_hash IS NULL OR payload_hash = $2) AND error_count < $3"
	" RETURNING error_count",
	4, {BYTEAOID, BYTEAOID, INT4OID, OIDOID}
};

/* A message's state, count and current delay, for a fail that recorded nothing. */
static IdemStatement read_row_delay = {
	"SELECT state, error_count, retry_at - failed_at"
	" FROM @extschema@.idem_inbox WHERE inbox_key = $1 AND scope = $2",
	2, {BYTEAOID, OIDOID}
};

static IdemStatement read_message = {
	"SELECT state, payload_hash, error_count, scope"
	" FROM @extschema@.idem_inbox WHERE inbox_key = $1 AND (scope = $2 OR scope = 0::pg_catalog.oid)"
	" ORDER BY scope = $2 DESC LIMIT 1",
	2, {BYTEAOID, OIDOID}
};

/*
 * A failed message whose attempts are used up, found by begin; the same
 * parameters as start_attempt ($2, the payload hash, is not needed).
 */
static IdemStatement dead_at_begin = {
	"UPDATE @extschema@.idem_inbox"
	" SET state = 'dead', dead_at = clock_timestamp(), retry_at = NULL,"
	"  max_attempts = $3"
	" WHERE inbox_key = $1 AND scope = $4 AND state = 'failed' AND error_count >= $3"
	"  AND $2 IS NOT NULL"
	" RETURNING consumer, message_id, error_count, last_error",
	4, {BYTEAOID, BYTEAOID, INT4OID, OIDOID}
};

static IdemStatement mark_done = {
	"UPDATE @extschema@.idem_inbox"
	" SET state = 'done', processed_at = clock_timestamp(), retry_at = NULL"
	" WHERE inbox_key = $1 AND scope = $2 AND state = 'processing'",
	2, {BYTEAOID, OIDOID}
};

static IdemStatement revive_message = {
	"UPDATE @extschema@.idem_inbox"
	" SET state = 'failed', error_count = 0, dead_at = NULL, retry_at = NULL"
	" WHERE inbox_key = $1 AND state = 'dead'",
	1, {BYTEAOID}
};

#define PRUNABLE(alias) \
	"((" alias "state = 'done' AND " alias "processed_at < clock_timestamp() - $2)" \
	" OR (" alias "state = 'dead' AND " alias "dead_at < clock_timestamp() - $2))"

/* Written by TID, not by a probe of the hashed key: see keys/cleanup.c. */
static IdemStatement prune_messages = {
	IDEM_BATCH_BY_TID("DELETE FROM @extschema@.idem_inbox m", "m", "idem_inbox", PRUNABLE, "$1"),
	2, {INT4OID, INTERVALOID},
	.by_tid = true
};

/*
 * The (consumer, message_id) arguments, checked, and the row key they
 * make: SHA-256 of the domain tag and the two length-prefixed strings.
 */
static bytea *
message_key(FunctionCallInfo fcinfo, text **consumer, text **message_id)
{
	text	   *fields[2];

	idem_require_arg(fcinfo, 0, "consumer");
	idem_require_arg(fcinfo, 1, "message_id");
	*consumer = PG_GETARG_TEXT_PP(0);
	*message_id = PG_GETARG_TEXT_PP(1);
	if (VARSIZE_ANY_EXHDR(*consumer) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("consumer must not be empty")));
	if (VARSIZE_ANY_EXHDR(*message_id) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("message_id must not be empty")));

	fields[0] = *consumer;
	fields[1] = *message_id;
	return idem_tuple_digest(inbox_domain, fields, 2);
}

/*
 * Mark a message dead and stage its dead-letter event; from the RETURNING
 * row (consumer, message_id, error_count, last_error) of the statement
 * that made it dead.  Caller is in SPI.
 */
static void
dead_letter(Oid namespace, Oid scope, HeapTuple row, TupleDesc desc, int first_column)
{
	bool		isnull;
	bool		error_null;
	Datum		consumer = SPI_getbinval(row, desc, first_column, &isnull);
	Datum		message_id = SPI_getbinval(row, desc, first_column + 1, &isnull);
	int32		error_count = DatumGetInt32(SPI_getbinval(row, desc, first_column + 2, &isnull));
	Datum		last_error = SPI_getbinval(row, desc, first_column + 3, &error_null);

	idem_outbox_stage_dead_letter(namespace, scope, consumer, message_id, error_count,
								  last_error, error_null);
	idem_count(IDEM_STAT_INBOX_DEAD_LETTERED, 1);
}

/* Does a stored payload hash (NULL: a legacy row) allow this delivery? */
static bool
same_payload(HeapTuple row, TupleDesc desc, int column, bytea *payload_hash)
{
	bool		isnull;
	Datum		stored = SPI_getbinval(row, desc, column, &isnull);
	bytea	   *hash;

	if (isnull)
		return true;
	hash = DatumGetByteaPP(stored);
	return VARSIZE_ANY_EXHDR(hash) == IDEM_DIGEST_LEN &&
		memcmp(VARDATA_ANY(hash), VARDATA_ANY(payload_hash), IDEM_DIGEST_LEN) == 0;
}

/*
 * The scope of a message's row: the caller's, or the shared scope when the
 * message was delivered before 0.3.0 (such rows are shared by every role).
 */
static Datum
message_scope(Oid namespace, bytea *key, Oid scope)
{
	Datum		read[2];
	bool		isnull;

	read[0] = PointerGetDatum(key);
	read[1] = ObjectIdGetDatum(scope);
	if (idem_execute(&read_message, namespace, read, NULL, false, 1) == 0)
		return ObjectIdGetDatum(scope);
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4, &isnull);
}

/*
 * The decision of begin: write to take the message, and if that touched
 * nothing, read why.  Loops when the message changed in between.
 */
static IdemInboxAnswer
begin_message(Oid namespace, bytea *key, Datum scope, Oid caller_scope, text *consumer,
			  text *message_id, bytea *payload_hash, int32 max_attempts)
{
	Datum		values[6];
	Datum		take[4];
	Datum		read[2];
	int			round;

	values[0] = PointerGetDatum(key);
	values[1] = PointerGetDatum(consumer);
	values[2] = PointerGetDatum(message_id);
	values[3] = PointerGetDatum(payload_hash);
	values[4] = Int32GetDatum(max_attempts);
	values[5] = scope;
	take[0] = PointerGetDatum(key);
	take[1] = PointerGetDatum(payload_hash);
	take[2] = Int32GetDatum(max_attempts);
	take[3] = scope;
	read[0] = PointerGetDatum(key);
	read[1] = scope;

	for (round = 0; round < BEGIN_MAX_ROUNDS; round++)
	{
		HeapTuple	row;
		TupleDesc	desc;
		bool		isnull;
		char	   *state;
		int32		error_count;

		CHECK_FOR_INTERRUPTS();

		/* A first delivery; waits for an in-flight first delivery. */
		if (idem_execute(&insert_message, namespace, values, NULL, false, 1) == 1)
			return IDEM_INBOX_ANSWER_PROCESS;
		/* A retry of a failed message. */
		if (idem_execute(&start_attempt, namespace, take, NULL, false, 1) == 1)
			return IDEM_INBOX_ANSWER_PROCESS;

		if (idem_execute(&read_message, namespace, read, NULL, false, 1) == 0)
			continue;			/* pruned, or its first delivery rolled back */
		row = SPI_tuptable->vals[0];
		desc = SPI_tuptable->tupdesc;
		state = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
		error_count = DatumGetInt32(SPI_getbinval(row, desc, 3, &isnull));

		if (!same_payload(row, desc, 2, payload_hash))
			return IDEM_INBOX_ANSWER_MISMATCH;
		if (strcmp(state, "done") == 0)
			return IDEM_INBOX_ANSWER_DUPLICATE;
		if (strcmp(state, "dead") == 0)
			return IDEM_INBOX_ANSWER_DEAD;
		if (strcmp(state, "failed") == 0 && error_count >= max_attempts)
		{
			if (idem_execute(&dead_at_begin, namespace, take, NULL, false, 1) == 1)
			{
				dead_letter(namespace, caller_scope, SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
				return IDEM_INBOX_ANSWER_DEAD;
			}
		}
		else if (strcmp(state, "processing") == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("inbox message is already being processed in this transaction")));
		/* It changed between our write and our read: decide again. */
	}

	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not begin inbox message: it changed concurrently %d times",
					BEGIN_MAX_ROUNDS),
			 errhint("The transaction might succeed if retried.")));
	pg_unreachable();
}

/*
 * Write the failures an adopted entry carried (a session that could not
 * record them handed them over), before begin decides: the message may be
 * dead by them.  Returns dead when it is (its dead letter staged), IDEM_INBOX_NOT_RECORDED
 * otherwise.  Caller is in SPI.
 */
static IdemInboxAnswer
adopt_failures(Oid namespace, const InboxHandOver *what, text *consumer, text *message_id,
			   int32 adopted)
{
	int32		error_count;
	Datum		retry_after;
	IdemInboxAnswer recorded;

	recorded = idem_inbox_record_failure(namespace, what, PointerGetDatum(consumer),
										 PointerGetDatum(message_id), 0, adopted,
										 CStringGetTextDatum(HANDED_OVER_ERROR),
										 &error_count, &retry_after);
	return recorded == IDEM_INBOX_ANSWER_DEAD ? recorded : IDEM_INBOX_NOT_RECORDED;
}

/*
 * The registry entry of the message for this begin: taken (waiting for
 * another session's attempt), or this session's own orphan of it, which
 * it adopts; the failures that come with it.
 */
static int32
take_message(const InboxHandOver *what, const bytea *key)
{
	InboxAttempt *mine = idem_inbox_find_attempt(what->scope, key);

	if (mine != NULL && mine->open)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("inbox message is already being processed in this transaction")));
	if (mine != NULL && mine->recorded)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the failure of the previous attempt at this inbox message is not committed yet"),
				 errdetail("idem_inbox_fail recorded it earlier in this transaction."),
				 errhint("Commit the transaction before beginning the message again.")));
	/* Our own orphan: hand it over and take it back, failures and all. */
	if (mine != NULL)
		idem_inbox_hand_back(mine);
	return idem_inbox_take(what);
}

/*
 * idem_inbox_begin(consumer, message_id, payload_hash, max_attempts):
 * process, duplicate, dead or mismatch, inside the consumer's transaction.
 */
Datum
idem_inbox_begin(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	text	   *consumer;
	text	   *message_id;
	bytea	   *key = message_key(fcinfo, &consumer, &message_id);
	bytea	   *payload_hash = idem_digest_arg(fcinfo, 2, "payload_hash");
	Oid			caller_scope = idem_current_scope();
	InboxHandOver what;
	Datum		scope;
	int32		max_attempts;
	volatile int32 adopted = 0;
	IdemInboxAnswer outcome;

	idem_require_arg(fcinfo, 3, "max_attempts");
	max_attempts = PG_GETARG_INT32(3);
	if (max_attempts < 1 || max_attempts > IDEM_INBOX_MAX_ATTEMPTS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_attempts must be between 1 and %d", IDEM_INBOX_MAX_ATTEMPTS),
				 errdetail("The max_attempts given is %d.", max_attempts)));
	idem_require_served_schema(namespace);

	/* The message's row scope: the caller's, or shared (from before 0.3.0). */
	SPI_connect();
	scope = message_scope(namespace, key, caller_scope);
	SPI_finish();
	idem_inbox_describe(&what, DatumGetObjectId(scope), key, caller_scope, consumer, message_id);
	what.max_attempts = max_attempts;
	what.has_payload_hash = true;
	memcpy(what.payload_hash, VARDATA_ANY(payload_hash), IDEM_DIGEST_LEN);

	adopted = take_message(&what, key);
	PG_TRY();
	{
		SPI_connect();
		outcome = adopted > 0 ? adopt_failures(namespace, &what, consumer, message_id, adopted) : IDEM_INBOX_NOT_RECORDED;
		if (outcome == IDEM_INBOX_NOT_RECORDED)
			outcome = begin_message(namespace, key, scope, caller_scope, consumer, message_id,
									payload_hash, max_attempts);
		SPI_finish();
	}
	PG_CATCH();
	{
		idem_inbox_registry_hand_over(what.scope, what.key, adopted);
		PG_RE_THROW();
	}
	PG_END_TRY();

	/*
	 * An attempt keeps the entry until it is accounted for; so does a begin
	 * that wrote adopted failures, until they commit.
	 */
	if (outcome == IDEM_INBOX_ANSWER_PROCESS || adopted > 0)
		(void) idem_inbox_remember(namespace, &what, consumer, message_id, adopted,
								   outcome == IDEM_INBOX_ANSWER_PROCESS);

	if (outcome == IDEM_INBOX_ANSWER_PROCESS)
	{
		idem_count(IDEM_STAT_INBOX_PROCESS, 1);
		PG_RETURN_TEXT_P(cstring_to_text(idem_inbox_answers[outcome]));
	}
	if (adopted == 0)
		idem_inbox_registry_release(what.scope, what.key);
	if (outcome == IDEM_INBOX_ANSWER_DUPLICATE)
		idem_count(IDEM_STAT_INBOX_DUPLICATE, 1);
	else if (outcome == IDEM_INBOX_ANSWER_DEAD)
		idem_count(IDEM_STAT_INBOX_DEAD, 1);
	else
		idem_count(IDEM_STAT_INBOX_MISMATCH, 1);
	PG_RETURN_TEXT_P(cstring_to_text(idem_inbox_answers[outcome]));
}

/* This transaction's attempt at a message, for done: the caller's scope only. */
static InboxAttempt *
running_attempt(Oid namespace, const bytea *key)
{
	InboxAttempt *attempt = idem_inbox_my_attempt(idem_current_scope(), key);

	if (attempt == NULL || !attempt->open || !attempt->ran)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("inbox message was not begun in this transaction"),
				 errhint("Call idem_inbox_done in the transaction whose idem_inbox_begin answered process.")));
	return attempt;
}

/*
 * idem_inbox_done(consumer, message_id): the message begun in this
 * transaction is processed; commits with the handler's effects.
 */
Datum
idem_inbox_done(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	text	   *consumer;
	text	   *message_id;
	bytea	   *key = message_key(fcinfo, &consumer, &message_id);
	InboxAttempt *attempt = running_attempt(namespace, key);
	Datum		values[2];
	int			n;

	values[0] = PointerGetDatum(key);
	values[1] = ObjectIdGetDatum(attempt->what.scope);
	SPI_connect();
	n = idem_execute(&mark_done, namespace, values, NULL, false, 1);
	SPI_finish();
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("inbox message is no longer being processed"),
				 errdetail("It was already marked done or failed in this transaction.")));
	idem_count(IDEM_STAT_INBOX_DONE, 1);
	PG_RETURN_VOID();
}

/*
 * The attempt a fail accounts for, and how many failures it records: this
 * session's own (its run, with begin's write in effect: the savepoint
 * protocol; or an orphan, with all it carries), or, without one, the
 * message's registry entry taken here (waiting for another session's
 * attempt): the failures handed over with it, or one.
 */
static InboxAttempt *
failing_attempt(Oid namespace, const bytea *key, Oid caller_scope, text *consumer,
				text *message_id, int32 *failures)
{
	InboxAttempt *known = idem_inbox_my_attempt(caller_scope, key);
	InboxHandOver what;
	Datum		scope;
	volatile int32 adopted;
	InboxAttempt *attempt = NULL;

	if (known != NULL && known->recorded)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the failure of this inbox attempt is already recorded"),
				 errdetail("idem_inbox_fail was called for it earlier in this transaction."),
				 errhint("Commit the transaction.")));
	if (known != NULL && known->open && !known->ran)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("inbox message was not begun in this transaction"),
				 errdetail("idem_inbox_begin did not answer process for it.")));
	if (known != NULL && idem_inbox_reclaim(known))
	{
		*failures = known->open ? 1 : known->uncounted;
		return known;
	}
	if (known != NULL)
	{
		/* Adopted by another delivery, which writes its failures. */
		*failures = 0;
		return NULL;
	}

	SPI_connect();
	scope = message_scope(namespace, (bytea *) key, caller_scope);
	SPI_finish();
	idem_inbox_describe(&what, DatumGetObjectId(scope), key, caller_scope, consumer, message_id);
	adopted = idem_inbox_take(&what);
	PG_TRY();
	{
		attempt = idem_inbox_remember(namespace, &what, consumer, message_id, 0, false);
		attempt->open = false;
		attempt->uncounted = adopted;
		attempt->started_at = 0;	/* no attempt of this session */
	}
	PG_CATCH();
	{
		idem_inbox_registry_hand_over(what.scope, what.key, adopted);
		PG_RE_THROW();
	}
	PG_END_TRY();
	*failures = adopted > 0 ? adopted : 1;
	return attempt;
}

/*
 * What fail answers when it recorded nothing: duplicate (the message is
 * done), dead, or retry with the message's count and delay as they stand
 * (another delivery adopted the attempt and writes its failures).  Caller
 * is in SPI.
 */
static IdemInboxAnswer
answer_from_row(Oid namespace, bytea *key, Oid caller_scope, int32 *error_count,
				Datum *retry_after)
{
	Datum		read[2];
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;
	char	   *state;

	read[0] = PointerGetDatum(key);
	read[1] = message_scope(namespace, key, caller_scope);
	if (idem_execute(&read_row_delay, namespace, read, NULL, false, 1) == 0)
		elog(ERROR, "inbox message vanished while its failure was recorded");
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	state = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
	*error_count = DatumGetInt32(SPI_getbinval(row, desc, 2, &isnull));
	if (strcmp(state, "done") == 0)
		return IDEM_INBOX_ANSWER_DUPLICATE;
	if (strcmp(state, "dead") == 0)
		return IDEM_INBOX_ANSWER_DEAD;
	*retry_after = SPI_getbinval(row, desc, 3, &isnull);
	if (isnull)
		*retry_after = (Datum) 0;
	return IDEM_INBOX_ANSWER_RETRY;
}

/*
 * idem_inbox_fail(consumer, message_id, error): record a failed attempt
 * after its transaction rolled back (or after ROLLBACK TO a savepoint
 * taken after begin).  retry with the delay before the next attempt, or
 * dead at the cap (with its dead-letter event staged); duplicate if the
 * message was processed by another delivery meanwhile.  The attempt stays
 * this session's (and keeps the message's entry) until this transaction
 * commits: if it aborts, or the connection drops first, the attempt is an
 * orphan again and is still counted.
 */
Datum
idem_inbox_fail(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	MemoryContext outer = CurrentMemoryContext;
	text	   *consumer;
	text	   *message_id;
	bytea	   *key = message_key(fcinfo, &consumer, &message_id);
	InboxAttempt *attempt;
	TupleDesc	tupdesc;
	Datum		result[3];
	bool		resnull[3] = {false, false, true};
	IdemInboxAnswer outcome;
	int32		failures;
	int32		error_count = 0;
	Datum		retry_after = (Datum) 0;
	HeapTuple	tuple;
	Oid			caller_scope = idem_current_scope();

	idem_require_arg(fcinfo, 2, "error");
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	idem_require_served_schema(namespace);

	attempt = failing_attempt(namespace, key, caller_scope, consumer, message_id, &failures);
	SPI_connect();
	outcome = attempt == NULL ? IDEM_INBOX_NOT_RECORDED :
		idem_inbox_record_failure(namespace, &attempt->what, PointerGetDatum(consumer),
								  PointerGetDatum(message_id), attempt->started_at,
								  failures, PG_GETARG_DATUM(2),
								  &error_count, &retry_after);
	if (outcome == IDEM_INBOX_NOT_RECORDED)
		outcome = answer_from_row(namespace, key, caller_scope, &error_count, &retry_after);
	if (attempt != NULL)
		idem_inbox_mark_recorded(attempt);
	if (retry_after != (Datum) 0)
	{
		MemoryContext old = MemoryContextSwitchTo(outer);

		result[2] = datumCopy(retry_after, false, sizeof(Interval));
		resnull[2] = false;
		MemoryContextSwitchTo(old);
	}
	SPI_finish();

	/* Made after SPI_finish, which frees what was allocated inside SPI. */
	result[0] = CStringGetTextDatum(idem_inbox_answers[outcome]);
	result[1] = Int32GetDatum(error_count);
	tuple = heap_form_tuple(BlessTupleDesc(tupdesc), result, resnull);
	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}

/*
 * idem_inbox_retry(consumer, message_id): revive a dead message on
 * purpose, with a fresh count of attempts, in every scope (an
 * administrator's function: idem_admin revives any role's message); false
 * if none is dead.
 */
Datum
idem_inbox_retry(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	text	   *consumer;
	text	   *message_id;
	bytea	   *key = message_key(fcinfo, &consumer, &message_id);
	Datum		values[1];
	int			n;

	values[0] = PointerGetDatum(key);
	SPI_connect();
	n = idem_execute(&revive_message, namespace, values, NULL, false, 0);
	SPI_finish();
	if (n > 0)
		idem_count(IDEM_STAT_INBOX_REVIVED, n);
	PG_RETURN_BOOL(n > 0);
}

/*
 * idem_inbox_prune(older_than, batch): delete at most batch done or dead
 * messages finished more than older_than ago.  A pruned message that is
 * delivered again is processed again: older_than is the dedup window.
 */
Datum
idem_inbox_prune(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Interval   *older_than;
	Interval	zero = {0};
	int32		batch;
	Datum		values[2];
	int			deleted;

	idem_require_arg(fcinfo, 0, "older_than");
	older_than = PG_GETARG_INTERVAL_P(0);
	if (DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(older_than),
										  IntervalPGetDatum(&zero))) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("older_than must not be negative")));
	idem_require_arg(fcinfo, 1, "batch");
	batch = PG_GETARG_INT32(1);
	if (batch < 1 || batch > PRUNE_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", PRUNE_MAX_BATCH),
				 errdetail("The batch given is %d.", batch)));

	values[0] = Int32GetDatum(batch);
	values[1] = IntervalPGetDatum(older_than);
	SPI_connect();
	deleted = idem_execute(&prune_messages, namespace, values, NULL, false, 0);
	SPI_finish();
	idem_count(IDEM_STAT_INBOX_PRUNED, deleted);
	PG_RETURN_INT64(deleted);
}

/*
 * Constraint trigger idem_inbox_message_done: refuse to commit a
 * transaction in which a begun message is still processing.  Same shape
 * as idem_keys_claim_finished (keys/in_transaction_guard.c).
 */
Datum
idem_inbox_message_done(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleTableSlot *slot;
	bool		isnull;
	Datum		consumer;
	Datum		message_id;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"idem_inbox_message_done\" was not called by trigger manager")));
	if (!TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"idem_inbox_message_done\" must be fired AFTER INSERT OR UPDATE FOR EACH ROW")));

	slot = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ?
		trigdata->tg_newslot : trigdata->tg_trigslot;

	/* Marked done or failed later in the transaction: fine. */
	if (!table_tuple_satisfies_snapshot(trigdata->tg_relation, slot, SnapshotSelf))
		return PointerGetDatum(NULL);

	consumer = slot_getattr(slot, 2, &isnull);
	message_id = slot_getattr(slot, 3, &isnull);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_MESSAGE_UNFINISHED),
			 errmsg("inbox message begun in this transaction was not marked done"),
			 errdetail("Message %s of consumer %s is still processing at commit.",
					   quote_literal_cstr(TextDatumGetCString(message_id)),
					   quote_literal_cstr(TextDatumGetCString(consumer))),
			 errhint("Call idem_inbox_done before COMMIT, or roll back and call idem_inbox_fail."),
			 errtableconstraint(trigdata->tg_relation, "idem_inbox_message_done")));
	return PointerGetDatum(NULL);
}
