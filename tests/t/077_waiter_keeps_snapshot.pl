# A backend waiting in the server (a claim follower, idem_outbox_wait)
# keeps its statement's snapshot horizon (issue 24, item 7).
#
# The statement around the wait may read with its snapshot after the wait
# returns: here a STABLE SQL function later in the same target list counts
# a table.  While the waiter sleeps another session deletes every row and
# vacuums the table; if the waiter had dropped its xmin, VACUUM would
# remove the rows its snapshot must still see and the count would be 0.
#
# Deterministic: the waiter is seen sleeping in pg_stat_activity before
# the DELETE, and every wait is far longer than the steps that end it.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('waiter_snapshot');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_idem'
idem.cleanup_worker = off
autovacuum = off
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION pg_idem;
	CREATE FUNCTION k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE
		AS $$ SELECT idem_key('tap', 'POST', '/snapshot', name) $$;
	CREATE TABLE winners (name text PRIMARY KEY, claim_id uuid);
	CREATE TABLE counted (n int);
	CREATE FUNCTION f() RETURNS bigint LANGUAGE sql STABLE
		AS $$ SELECT count(*) FROM counted $$;
});

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# Start the waiting statement and return once it sleeps in the server.
sub start_waiter
{
	my ($label, $sql) = @_;
	q1('TRUNCATE counted; INSERT INTO counted SELECT generate_series(1, 1000)');
	my $session = $node->background_psql('postgres');
	$session->query_until(qr/started/, "\\echo started\n$sql;\n");
	ok( $node->poll_query_until('postgres', qq{
			SELECT count(*) = 1 FROM pg_stat_activity
			 WHERE query LIKE '%$label%' AND wait_event_type = 'Extension'
			   AND pid <> pg_backend_pid()}),
		"$label: the waiter sleeps in the server");
	return $session;
}

# Remove every row and vacuum while the waiter sleeps.
sub delete_and_vacuum
{
	q1('DELETE FROM counted');
	q1('VACUUM counted');
}

# What the waiter's statement answered (blocks until it does).
sub answer
{
	my ($session, $label) = @_;
	my $out = $session->query_safe("SELECT 'done'");
	$session->quit;
	my ($got) = $out =~ /($label:\S+)/;
	return $got // "no answer: $out";
}

### A claim follower, woken by the winner's finalize.
q1(q{INSERT INTO winners SELECT 'snap', claim_id
       FROM idem_claim(k('snap'), sha256('b'), '1 hour')});
my $f = start_waiter('follower-snap',
	q{SELECT 'follower-snap:' || (idem_claim(k('snap'), sha256('b'), NULL, '60 s')).outcome
	         || ':' || f()});
delete_and_vacuum();
q1(q{SELECT idem_finalize(k('snap'), claim_id, 201, NULL, 'ok') FROM winners WHERE name = 'snap'});
is(answer($f, 'follower-snap'), 'follower-snap:replay:1000',
	'follower: a function after the wait still sees the rows of the statement snapshot');

### A drainer in idem_outbox_wait, woken by a stage's commit.
my $d = start_waiter('drainer-snap',
	q{SELECT 'drainer-snap:' || idem_outbox_wait('60 s') || ':' || f()});
delete_and_vacuum();
q1(q{SELECT idem_outbox_stage('orders', '{"n": 1}'::jsonb)});
is(answer($d, 'drainer-snap'), 'drainer-snap:true:1000',
	'idem_outbox_wait: a function after the wait still sees the rows of the statement snapshot');

$node->stop;
done_testing();
