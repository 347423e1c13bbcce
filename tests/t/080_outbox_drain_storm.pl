# A storm of outbox drainers on the direct path (no event held by two,
# per-key order kept, the owner's maintenance beside them): one producer
# stages keyed and keyless events, a maintenance session rebuilds the
# claim's indexes (REINDEX CONCURRENTLY) and vacuums the tables, and
# five drainers claim batches with leases of a few milliseconds, nap for
# up to longer than the lease, and then ack, nack or abandon what they
# hold, so that leases run out under them, others take the events over,
# and late acks and nacks race the new claims.  Every claim, ack and nack is logged with what it
# was told.  Afterwards, and after the rest is drained:
#   - no claim returned more than its batch;
#   - no event was handed out twice from one version (each claim of an
#     event counts a new attempt), and none while its lease was live
#     (only after the lease's end, or after a nack released it);
#   - each published event was acked once, by the claim that held it last
#     (the archive keeps that claim's token and attempt), every other ack
#     of it was told 0, and a nack of a published event was told stale;
#   - per-key order: no event of a key was claimed before every earlier
#     event of that key was published or dead;
#   - nothing lost: every staged event is archived or dead;
#   - the queue's and the claimed table's indexes pass amcheck.
# pgbench runs without --max-tries: any error aborts a client and fails.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# Nacked events are due again at once, and the fourth attempt is the last.
my $node = IdemTest::new_node('drain_storm', "idem.outbox_backoff = '0'",
	'idem.outbox_max_attempts = 4');

$node->safe_psql('postgres', q{
	CREATE EXTENSION amcheck;
	CREATE UNLOGGED TABLE staged (id bigint, key text);
	CREATE UNLOGGED TABLE claims (token uuid, id bigint, key text, attempts integer,
	                              claimed_at timestamptz, lease_end timestamptz,
	                              batch integer);
	CREATE UNLOGGED TABLE acks (token uuid, id bigint, acked integer, at timestamptz);
	CREATE UNLOGGED TABLE nacks (token uuid, id bigint, outcome text, at timestamptz);
});

# One producer (a key's events get ids in the order they commit), one
# event per transaction, for the length of the storm.
$node->safe_psql('postgres', q{
	CREATE PROCEDURE storm_produce(secs float8) LANGUAGE plpgsql AS $$
	DECLARE
		until timestamptz := clock_timestamp() + make_interval(secs => secs);
		k integer;
		key text;
	BEGIN
		WHILE clock_timestamp() < until LOOP
			k := floor(random() * 13)::integer;
			key := CASE WHEN k = 0 THEN NULL ELSE 'key-' || k END;
			INSERT INTO staged SELECT idem_outbox_stage('storm', jsonb_build_object('k', k), key), key;
			COMMIT;
			PERFORM pg_sleep(0.002);
		END LOOP;
	END $$;
});
my $producer = $node->background_psql('postgres');
$producer->query_until(qr/producing/, "\\echo producing\nCALL storm_produce(5);\n");
# Maintenance meanwhile: the scanned indexes rebuilt under the claims (the
# claim's kept state is rebuilt, and the rebuilt ones must pass its
# checks), and VACUUM behind them.
my $maintenance = $node->background_psql('postgres');
$maintenance->query_until(qr/maintaining/, "\\echo maintaining\n" . join('', map {
	"REINDEX INDEX CONCURRENTLY idem_outbox_claimable;\n"
	  . "REINDEX INDEX CONCURRENTLY idem_outbox_key_order;\n"
	  . "REINDEX INDEX CONCURRENTLY idem_outbox_claimed_claimable;\n"
	  . "REINDEX INDEX CONCURRENTLY idem_outbox_claimed_key_order;\n"
	  . "VACUUM idem_outbox_queue, idem_outbox_claimed;\n" } 1 .. 20));

my %scripts = (
	# Drainers: claim up to 5 with a lease of 1 to 30 ms, nap 0 to 40 ms,
	# then ack all (70 %), nack all (20 %) or walk away (10 %).
	'storm_drain' => q{
\set lease random(1, 30)
\set nap random(0, 40)
\set how random(0, 9)
WITH c AS (SELECT * FROM idem_outbox_claim(5, make_interval(secs => :lease / 1000.0))),
     l AS (INSERT INTO claims SELECT claim_token, id, key, attempts, clock_timestamp(),
                                     lease_expires_at, 5 FROM c)
SELECT count(*) AS n, coalesce(min(claim_token::text), '00000000-0000-0000-0000-000000000000') AS tok
  FROM c \gset
\if :n > 0
\sleep :nap ms
\if :how < 7
INSERT INTO acks SELECT token, id, idem_outbox_ack(token, ARRAY[id]), clock_timestamp()
  FROM claims WHERE token = :tok::uuid;
\elif :how < 9
INSERT INTO nacks SELECT token, id, (idem_outbox_nack(token, id, 'storm')).outcome, clock_timestamp()
  FROM claims WHERE token = :tok::uuid;
\endif
\endif
},);

$node->pgbench(
	'--no-vacuum --client=5 --jobs=2 --time=6 --protocol=extended',
	0,
	[
		qr{number of transactions actually processed: [1-9]},
		qr{number of failed transactions: 0 }
	],
	[qr{^$}],
	'five drainers with short leases beside a producer',
	\%scripts);
$producer->quit;
$maintenance->quit;

# Drain the rest, with leases that do not run out.
for my $round (1 .. 200)
{
	last if $node->safe_psql('postgres', q{
		SELECT count(*) FROM idem_outbox WHERE topic = 'storm' AND state = 'pending'}) == 0;
	$node->safe_psql('postgres', q{
		UPDATE idem_outbox_claimed SET available_at = clock_timestamp()
		 WHERE topic = 'storm' AND state = 'pending' AND available_at > clock_timestamp();
		WITH c AS (SELECT * FROM idem_outbox_claim(100, '1 min')),
		     l AS (INSERT INTO claims SELECT claim_token, id, key, attempts, clock_timestamp(),
		                                     lease_expires_at, 100 FROM c RETURNING *)
		INSERT INTO acks SELECT token, id, idem_outbox_ack(token, ARRAY[id]), clock_timestamp() FROM l;
	});
}

my %seen = map { split /\|/ } split /\n/, $node->safe_psql('postgres', q{
	SELECT 'staged', count(*) FROM staged
	UNION ALL SELECT 'claims', count(*) FROM claims
	UNION ALL SELECT 'taken over', count(*) FROM (
		SELECT attempts > 1 FROM claims WHERE attempts > 1) s
	UNION ALL SELECT 'stale acks', count(*) FROM acks WHERE acked = 0
	UNION ALL SELECT 'stale nacks', count(*) FROM nacks WHERE outcome = 'stale'
	UNION ALL SELECT 'retries', count(*) FROM nacks WHERE outcome = 'retry'
	UNION ALL SELECT 'dead', count(*) FROM idem_outbox WHERE topic = 'storm' AND state = 'dead'});
note join(', ', map { "$_: $seen{$_}" } sort keys %seen);
for my $what ('staged', 'taken over', 'stale acks', 'retries')
{
	cmp_ok($seen{$what} // 0, '>', 0, "the storm produced $what");
}

is( $node->safe_psql('postgres',
		'SELECT count(*) FROM (SELECT FROM claims GROUP BY token HAVING count(*) > min(batch)) s'),
	'0', 'no claim returned more than its batch');

is( $node->safe_psql('postgres',
		'SELECT count(*) - count(DISTINCT (id, attempts)) FROM claims'),
	'0', 'no event handed out twice from one version (each claim counted its attempt)');

is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM (
			SELECT c.id, c.token, c.claimed_at,
			       lag(c.lease_end) OVER w AS prev_end, lag(c.token) OVER w AS prev_token
			  FROM claims c WINDOW w AS (PARTITION BY c.id ORDER BY c.attempts)) s
		 WHERE s.claimed_at < s.prev_end
		   AND NOT EXISTS (SELECT FROM nacks n WHERE n.id = s.id AND n.token = s.prev_token
		                                        AND n.outcome = 'retry')}),
	'0', 'no event taken over while its lease was live (only after its end or a nack)');

is( $node->safe_psql('postgres', q{
		SELECT (SELECT count(*) FROM (SELECT FROM acks WHERE acked = 1 GROUP BY id
		                               HAVING count(*) > 1) s)
		     + (SELECT count(*) FROM acks WHERE acked NOT IN (0, 1))
		     + (SELECT count(*) FROM idem_outbox_archive a
		         WHERE a.topic = 'storm'
		           AND NOT EXISTS (SELECT FROM acks k WHERE k.id = a.id AND k.token = a.claim_token
		                                               AND k.acked = 1))
		     + (SELECT count(*) FROM idem_outbox_archive a
		         WHERE a.topic = 'storm'
		           AND (a.claim_token, a.attempts) NOT IN (SELECT c.token, c.attempts FROM claims c
		                                                    WHERE c.id = a.id))
		     + (SELECT count(*) FROM idem_outbox_archive a
		         WHERE a.topic = 'storm'
		           AND a.attempts <> (SELECT max(c.attempts) FROM claims c WHERE c.id = a.id))}),
	'0', 'each published event acked once, by the claim that held it last');

is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM nacks n JOIN idem_outbox_archive a USING (id)
		 WHERE n.outcome <> 'stale' AND n.at > a.published_at}),
	'0', 'a nack after the event was published was stale');

is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM claims c
		  JOIN staged e ON e.key = c.key AND e.id < c.id
		  LEFT JOIN idem_outbox_archive a ON a.id = e.id
		  LEFT JOIN idem_outbox q ON q.id = e.id AND q.state = 'dead'
		 WHERE c.claimed_at <= coalesce(a.published_at, q.dead_at, 'infinity')}),
	'0', 'per-key order: no event claimed before every earlier event of its key was finished');

is( $node->safe_psql('postgres', q{
		SELECT (SELECT count(*) FROM staged)
		     - (SELECT count(*) FROM idem_outbox_archive WHERE topic = 'storm')
		     - (SELECT count(*) FROM idem_outbox WHERE topic = 'storm' AND state = 'dead'),
		       (SELECT count(*) FROM idem_outbox WHERE topic = 'storm' AND state = 'pending'),
		       (SELECT count(*) FROM staged s WHERE NOT EXISTS (
		           SELECT FROM idem_outbox WHERE id = s.id))}),
	'0|0|0', 'nothing lost: every staged event is archived or dead');

is( $node->safe_psql('postgres', q{
		SELECT bt_index_check(i::regclass, true)
		  FROM unnest(ARRAY['idem_outbox_pkey', 'idem_outbox_claimable',
		                    'idem_outbox_key_order', 'idem_outbox_claimed_pkey',
		                    'idem_outbox_claimed_claimable', 'idem_outbox_claimed_key_order',
		                    'idem_outbox_claimed_dead']) i;
		SELECT 'ok'}),
	"\n\n\n\n\n\n\nok", 'the queue\'s and the claimed table\'s B-trees pass bt_index_check');

done_testing();
