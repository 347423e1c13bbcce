# A claim on a hot standby is refused with 25006 (read_only_sql_transaction)
# by the sequence it draws its generation from, before anything reads the
# WAL insertion timeline, which is undefined during recovery (issue 24,
# item 13: claim.c draws the sequence value first instead of relying on the
# evaluation order of an addition).  A new key, a take-over of a lease that
# ran out on the primary, idem_begin and a cooldown's recovery: each is
# refused the same way, and the standby keeps serving reads.  An outbox
# stage is refused by the insert's read-only check, before its sequence
# catch-up (sequences.c) could ask for a lock a standby does not grant.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('standby_claim_primary');
$primary->init(allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION pg_idem;
	CREATE FUNCTION k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE
		AS $$ SELECT idem_key('tap', 'POST', '/standby', name) $$;
	SELECT idem_claim(k('lapsed'), sha256('b'), '1 ms');
	SELECT idem_finalize(k('done'), claim_id, 201, NULL, 'ok')
	  FROM idem_claim(k('done'), sha256('b'));
	SELECT idem_fail(k('cooled'), claim_id, '1 ms')
	  FROM idem_claim(k('cooled'), sha256('b'));
});
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby_claim_standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

# Every winner's path on the standby: a proper 25006, no crash.
for my $case (
	[ 'a new key', q{SELECT idem_claim(k('new'), sha256('b'))} ],
	[ 'the take-over of a lapsed lease', q{SELECT idem_claim(k('lapsed'), sha256('b'))} ],
	[ 'the recovery after a cooldown', q{SELECT idem_claim(k('cooled'), sha256('b'))} ],
	[ 'idem_begin of a new key', q{BEGIN; SELECT idem_begin(k('begun'), sha256('b')); COMMIT} ],
	[ 'an outbox stage', q{SELECT idem_outbox_stage('orders', '{"n": 1}'::jsonb)}, 'INSERT' ])
{
	my ($what, $sql, $refuser) = @$case;
	$refuser //= 'nextval()';
	my ($rc, $out, $err) = $standby->psql('postgres', "\\set VERBOSITY verbose\n$sql");
	isnt($rc, 0, "standby: $what fails");
	like($err, qr/ERROR:  25006: cannot execute \Q$refuser\E in a read-only transaction/,
		"standby: $what is refused with 25006 by $refuser");
}

# The standby still answers what needs no write, and is still up.
is($standby->safe_psql('postgres', q{SELECT outcome FROM idem_claim(k('done'), sha256('b'))}),
	'replay', 'standby: a finished key replays');
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'standby: still serving');

$standby->stop;
$primary->stop;
done_testing();
