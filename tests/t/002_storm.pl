# A mixed pgbench storm over a few keys: claims, steals, renews,
# finalizes and cleanups racing; afterwards one row per key, no completed
# row written by a non-owner, generations never back, amcheck clean.
#
# Eight clients claim, steal (leases of a few milliseconds, handlers that
# sleep past them), renew, finalize, fail, release, abandon and clean up 50
# keys for a few seconds, in lease mode and in-transaction mode, with
# idem.ttl = 1s so that finished keys are re-claimed and deleted during the
# storm.  Every successful finalize stores its own claim_id as the response
# body and, in the same statement, records an "effect" (key, claim_id,
# generation).  Afterwards:
#   - one row per key, none outside the 50 keys (counted on the heap);
#   - every completed row was written by the claim that owns it: its body
#     is its claim_id, and the effect of that claim has its generation;
#   - no claim took effect twice, no two effects of a key share a
#     generation, and a key's effects carry increasing generations in the
#     order they were written (fencing never goes back);
#   - the primary-key index passes amcheck.
# pgbench runs without --max-tries: any error (a claim that kept losing
# races, a deadlock, IL002 at COMMIT) aborts a client and fails the test.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# 0.2.0's single horizon: keys past idem.ttl are re-claimed and deleted.
my $node = IdemTest::new_node('storm', "idem.ttl = '1s'", "idem.after_ttl = 'rerun'",
	'idem.tombstone_ttl = 0');

$node->safe_psql('postgres', q{
	CREATE EXTENSION amcheck;
	CREATE FUNCTION storm_key(i integer) RETURNS bytea
		LANGUAGE sql IMMUTABLE AS $$ SELECT idem_key('storm', 'POST', '/pay', i::text) $$;
	CREATE FUNCTION storm_hash(i integer) RETURNS bytea
		LANGUAGE sql IMMUTABLE AS $$ SELECT idem_request_hash(convert_to('pay ' || i, 'UTF8')) $$;
	-- One row per successful finalize, written in the finalize's statement.
	CREATE TABLE storm_effects (
		id bigserial PRIMARY KEY,
		cache_key bytea NOT NULL,
		claim_id uuid NOT NULL,
		generation bigint NOT NULL,
		mode text NOT NULL);
	-- What the clients were told, to check that the storm did race.
	CREATE UNLOGGED TABLE storm_log (event text NOT NULL);
	-- What each idem_cleanup call deleted.
	CREATE UNLOGGED TABLE storm_cleanups (deleted bigint NOT NULL);
});

# A claim that logs its outcome and sets owner, cid and gen for \if.
sub claim_sql
{
	my ($function, $lease) = @_;
	return qq{
WITH c AS (SELECT * FROM $function(storm_key(:k), storm_hash(:k), '$lease')),
     l AS (INSERT INTO storm_log SELECT outcome FROM c)
SELECT outcome IN ('claimed', 'recovered_ttl', 'recovered_abandoned') AS owner,
       coalesce(claim_id::text, 'none') AS cid, coalesce(generation, 0) AS gen
  FROM c \\gset
};
}

# A finalize whose response body is the claim_id, with its effect.
sub finalize_sql
{
	my ($mode) = @_;
	return qq{
WITH f AS (SELECT idem_finalize(storm_key(:k), :cid::uuid, 200, NULL,
                                convert_to(:cid, 'UTF8')) AS ok),
     e AS (INSERT INTO storm_effects (cache_key, claim_id, generation, mode)
           SELECT storm_key(:k), :cid::uuid, :gen::bigint, '$mode' FROM f WHERE ok)
INSERT INTO storm_log SELECT CASE WHEN ok THEN 'finalized' ELSE 'finalize_lost' END FROM f;
};
}

my %scripts = (
	# Lease mode: claim with a short lease, work for up to twice as long.
	'storm_work@6' => q{
\set k random(1, 50)
\set nap random(0, 60)
} . claim_sql('idem_claim', '30ms') . q{
\if :owner
\sleep :nap ms
} . finalize_sql('lease') . q{
\endif
},
	# Lease mode with a renew half-way: the renew may find the key stolen.
	'storm_renew@2' => q{
\set k random(1, 50)
\set nap1 random(0, 40)
\set nap2 random(0, 40)
} . claim_sql('idem_claim', '30ms') . q{
\if :owner
\sleep :nap1 ms
WITH r AS (SELECT idem_renew(storm_key(:k), :cid::uuid, '30ms') IS NOT NULL AS renewed),
     l AS (INSERT INTO storm_log SELECT CASE WHEN renewed THEN 'renewed' ELSE 'renew_lost' END FROM r)
SELECT renewed FROM r \gset
\if :renewed
\sleep :nap2 ms
} . finalize_sql('renew') . q{
\endif
\endif
},
	# In-transaction mode: claim, effect and finalize commit together.
	'storm_intx@2' => q{
\set k random(1, 50)
BEGIN;
} . claim_sql('idem_begin', '30ms') . q{
\if :owner
} . finalize_sql('intx') . q{
\endif
COMMIT;
},
	# A client that crashes after claiming: its lease is left to expire.
	'storm_abandon@1' => q{
\set k random(1, 50)
} . claim_sql('idem_claim', '5ms'),
	# Handlers that fail (with a short cooldown) or give the key back.
	'storm_fail@1' => q{
\set k random(1, 50)
\set how random(0, 1)
} . claim_sql('idem_claim', '30ms') . q{
\if :owner
INSERT INTO storm_log
SELECT CASE WHEN CASE WHEN :how = 0 THEN idem_fail(storm_key(:k), :cid::uuid, '10ms')
                      ELSE idem_release(storm_key(:k), :cid::uuid) END
            THEN 'failed_or_released' ELSE 'fail_lost' END;
\endif
},
	# Cleanup in small batches, from several clients at once.
	'storm_cleanup@1' => q{
INSERT INTO storm_cleanups SELECT idem_cleanup(10);
},);

$node->pgbench(
	'--no-vacuum --client=8 --jobs=2 --time=5 --protocol=extended',
	0,
	[
		qr{number of transactions actually processed: [1-9]},
		qr{number of failed transactions: 0 }
	],
	[qr{^$}],
	'storm of claims, steals, renews, finalizes and cleanups',
	\%scripts);

my %seen = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	'SELECT event, count(*) FROM storm_log GROUP BY event ORDER BY event');
note join(', ', map { "$_: $seen{$_}" } sort keys %seen);
for my $event (qw(claimed recovered_abandoned recovered_ttl in_progress finalized))
{
	cmp_ok($seen{$event} // 0, '>', 0, "the storm produced $event");
}
is( $node->safe_psql('postgres',
		'SELECT sum(deleted) > 0 AND max(deleted) <= 10 FROM storm_cleanups'),
	't', 'cleanups deleted keys, none more than its batch');

# Counted on the heap (no index): the primary key cannot hide a duplicate.
is( $node->safe_psql('postgres', q{
		SET enable_indexscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off;
		SELECT count(*) = count(DISTINCT cache_key)
		       AND count(*) FILTER (WHERE cache_key NOT IN
		           (SELECT storm_key(i) FROM generate_series(1, 50) i)) = 0
		  FROM idem_keys}),
	't', 'one row per key, and only the storm\'s keys');

is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM idem_keys
		 WHERE state = 'completed'
		   AND response_body IS DISTINCT FROM convert_to(claim_id::text, 'UTF8')}),
	'0', 'every completed row carries the response of the claim that owns it');

is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM idem_keys k
		 WHERE k.state = 'completed'
		   AND NOT EXISTS (SELECT FROM storm_effects e
		                    WHERE e.cache_key = k.cache_key AND e.claim_id = k.claim_id
		                      AND e.generation = k.generation)}),
	'0', 'every completed row has the effect of its owner, at its generation');

is( $node->safe_psql('postgres', q{
		SELECT (SELECT count(*) - count(DISTINCT claim_id) FROM storm_effects)
		     + (SELECT count(*) - count(DISTINCT (cache_key, generation)) FROM storm_effects)}),
	'0', 'no claim took effect twice, no two effects of a key share a generation');

is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM (
			SELECT generation < lag(generation) OVER (PARTITION BY cache_key ORDER BY id) AS back
			  FROM storm_effects) s
		 WHERE back}),
	'0', 'the effects of a key carry increasing generations');

is( $node->safe_psql('postgres', q{
		SELECT bt_index_check('idem_keys_pkey', true);
		SELECT bt_index_parent_check('idem_keys_pkey', true, true);
		SELECT 'ok'}),
	"\n\nok", 'idem_keys_pkey passes bt_index_check and bt_index_parent_check');

$node->stop;
done_testing();
