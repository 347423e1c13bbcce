/*-------------------------------------------------------------------------
 *
 * inbox_failure.c
 *	  Recording failed inbox attempts: the one statement every path that
 *	  counts a failure uses (idem_inbox_fail, begin adopting failures a
 *	  session handed over, an orphan at session exit, the cleanup worker:
 *	  inbox_cap.c).
 *
 * A plain INSERT ... ON CONFLICT DO UPDATE of error_count, so a recording
 * whose transaction aborts counts nothing, and the cap is reached by the
 * same arithmetic whichever path records.  Only the holder of the
 * message's registry entry records, so no failure is counted twice.  Reaching it marks the message
 * dead and stages its dead-letter event in the outbox, in the same
 * transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/hashing.h"
#include "core/settings.h"
#include "core/statements.h"
#include "core/stats.h"
#include "inbox/inbox.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/* Parameters of the failure recording (see record_failure). */
#define RECORD_ARGS {BYTEAOID, TEXTOID, TEXTOID, BYTEAOID, INT4OID, TEXTOID, \
					 TIMESTAMPTZOID, INT4OID, FLOAT8OID, FLOAT8OID, OIDOID}

/*
 * The retry delay after a message's n-th failure: idem.inbox_backoff_base
 * doubled n - 1 times, at most idem.inbox_backoff_max ($9, $10 in ms).
 * Computed in float8 with the exponent capped, so that every value of the
 * two settings (1 ms .. 1 day) gives a delay at any count: the interval
 * arithmetic overflowed past 2^27 days.
 */
#define RETRY_DELAY(n) \
	"make_interval(secs => least($9 * power(2::float8, least((" n ") - 1, 62)), $10) / 1000.0)"

/*
 * Record failed attempts: $1 key, $2 consumer, $3 message_id, $4 payload
 * hash and $5 max_attempts (both NULL when unknown), $6 error, $7 when
 * the attempt started (NULL: unknown), $8 how many failures, $9/$10 the
 * backoff base and cap, $11 the message's scope.  One clock_timestamp()
 * for failed_at and retry_at, so retry_at - failed_at is the delay
 * exactly.
 */
static IdemStatement record_failure = {
	"WITH now AS (SELECT clock_timestamp() AS t)"
	" INSERT INTO @extschema@.idem_inbox AS m"
	" (inbox_key, consumer, message_id, payload_hash, state, max_attempts,"
	"  error_count, last_error, received_at, attempt_started_at, failed_at,"
	"  retry_at, dead_at, scope)"
	" SELECT $1, $2, $3, $4,"
	"  CASE WHEN $8 >= $5 THEN 'dead' ELSE 'failed' END, $5, $8, $6, now.t, $7, now.t,"
	"  CASE WHEN $8 >= $5 THEN NULL ELSE now.t + " RETRY_DELAY("$8") " END,"
	"  CASE WHEN $8 >= $5 THEN now.t END, $11"
	" FROM now"
	" ON CONFLICT (inbox_key, scope) DO UPDATE SET"
	"  error_count = m.error_count + $8,"
	"  last_error = excluded.last_error,"
	"  attempt_started_at = coalesce(excluded.attempt_started_at, m.attempt_started_at),"
	"  failed_at = excluded.failed_at,"
	"  state = CASE WHEN m.error_count + $8 >= coalesce(m.max_attempts, $5)"
	"   THEN 'dead' ELSE 'failed' END,"
	"  dead_at = CASE WHEN m.error_count + $8 >= coalesce(m.max_attempts, $5)"
	"   THEN excluded.failed_at END,"
	"  retry_at = CASE WHEN m.error_count + $8 >= coalesce(m.max_attempts, $5) THEN NULL"
	"   ELSE excluded.failed_at + " RETRY_DELAY("m.error_count + $8") " END"
	" WHERE m.state IN ('failed', 'processing')"
	" RETURNING m.state, m.error_count, m.retry_at - m.failed_at, m.last_error",
	11, RECORD_ARGS
};

/*
 * Record failures of the message what describes (begin's failed attempt,
 * or failures adopted or handed over): failures of them at once.  Returns
 * retry or dead, or IDEM_INBOX_NOT_RECORDED when nothing was recorded: the message is
 * done or dead by now.  A dead letter goes to the scope of the role that
 * began the attempt.  Caller is in SPI.
 */
IdemInboxAnswer
idem_inbox_record_failure(Oid namespace, const InboxHandOver *what, Datum consumer,
						  Datum message_id, TimestampTz started_at, int32 failures,
						  Datum error, int32 *error_count, Datum *retry_after)
{
	Datum		values[11];
	char		nulls[11];
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;
	bool		error_null;
	Datum		last_error;
	char	   *state;

	Assert(failures > 0);
	memset(nulls, ' ', sizeof(nulls));
	values[0] = PointerGetDatum(idem_digest_bytea(what->key));
	values[1] = consumer;
	values[2] = message_id;
	if (what->has_payload_hash)
		values[3] = PointerGetDatum(idem_digest_bytea(what->payload_hash));
	else
		nulls[3] = 'n';
	values[4] = Int32GetDatum(what->max_attempts);
	if (what->max_attempts <= 0)
		nulls[4] = 'n';
	values[5] = error;
	values[6] = TimestampTzGetDatum(started_at);
	if (started_at == 0)
		nulls[6] = 'n';
	values[7] = Int32GetDatum(failures);
	values[8] = Float8GetDatum((double) idem_inbox_backoff_base_ms);
	values[9] = Float8GetDatum((double) idem_inbox_backoff_max_ms);
	values[10] = ObjectIdGetDatum(what->scope);

	/* Not failed nor processing: done or dead by now. */
	if (idem_execute(&record_failure, namespace, values, nulls, false, 1) == 0)
		return IDEM_INBOX_NOT_RECORDED;

	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	state = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
	*error_count = DatumGetInt32(SPI_getbinval(row, desc, 2, &isnull));
	if (strcmp(state, "dead") == 0)
	{
		/* Read before the call: its arguments' order is unspecified. */
		last_error = SPI_getbinval(row, desc, 4, &error_null);
		*retry_after = (Datum) 0;
		idem_outbox_stage_dead_letter(namespace, what->caller_scope, consumer, message_id,
									  *error_count, last_error, error_null);
		idem_count(IDEM_STAT_INBOX_DEAD_LETTERED, 1);
		return IDEM_INBOX_ANSWER_DEAD;
	}
	*retry_after = SPI_getbinval(row, desc, 3, &isnull);
	idem_count(IDEM_STAT_INBOX_RETRY, 1);
	return IDEM_INBOX_ANSWER_RETRY;
}
