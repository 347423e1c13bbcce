# Exactly-once under stress (issue 4).
#
# 1,000 requests over 20 keys (50 retries of each request, arriving in
# waves so that eight workers contend for the same key at once) are run by
# eight concurrent worker connections, each a psql process driven from here
# as a client application would drive its connection:
#   - fenced mode: the claim commits on its own; the handler's transaction
#     then writes a payment and calls idem_finalize(strict => true), which
#     raises IL001 (rolling the payment back) if the lease was stolen;
#   - in-transaction mode: idem_begin, the payment and the finalize commit
#     together.
# Leases are 80 ms; most handlers pause for longer, so leases run out
# mid-handler and are stolen; and a killer terminates random workers'
# backends, mostly in the middle of a handler.  A worker whose connection
# dies reconnects and retries its request from the start, as a client
# would.  A request is answered when its worker either committed the
# finalize of its own execution or was told replay.
#
# Afterwards every key has exactly one payment, its idem_keys row is the
# completed claim of that payment, and every one of the 1,000 responses is
# the response of that one execution.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $NKEYS = 20;
my $NREQUESTS = 1000;
my $NWORKERS = 8;
my $LEASE_MS = 80;
my $MAX_KILLS = 40;
my $TIME_LIMIT = 60;    # seconds for the whole run

my $node = IdemTest::new_node('stress');
$node->safe_psql('postgres', q{
	CREATE FUNCTION eo_key(label integer) RETURNS bytea
		LANGUAGE sql IMMUTABLE AS $$ SELECT idem_key('stress', 'POST', '/payments', label::text) $$;
	CREATE FUNCTION eo_hash(label integer) RETURNS bytea
		LANGUAGE sql IMMUTABLE AS $$ SELECT idem_request_hash(convert_to('pay ' || label, 'UTF8')) $$;
	-- The domain table: a payment per execution of a handler that committed.
	CREATE TABLE payments (
		id bigserial PRIMARY KEY,
		label integer NOT NULL,
		claim_id uuid NOT NULL,
		generation bigint NOT NULL,
		mode text NOT NULL);
	-- Filled at the end with what every request was answered.
	CREATE TABLE responses (request integer PRIMARY KEY, label integer NOT NULL,
	                        body text NOT NULL, how text NOT NULL);
});
my $connstr = $node->connstr('postgres') . ' application_name=eo_worker';

# Request r is the (r mod 50)th retry of the request for key int(r / 50):
# keys arrive in waves.  Worker w serves requests w, w + 8, w + 16, ...
my @workers = map { { id => $_, queue => [] } } 0 .. $NWORKERS - 1;
for my $r (0 .. $NREQUESTS - 1)
{
	push @{ $workers[ $r % $NWORKERS ]{queue} },
	  { request => $r, label => int($r * $NKEYS / $NREQUESTS) };
}

my %stats;
my %responses;    # request => [label, body, how]

# Start (or restart) a worker's psql; its first step reads its backend pid.
sub connect_worker
{
	my ($w) = @_;
	$w->{$_} = '' for qw(in out err);
	$w->{h} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=0', '-d', $connstr, '-f', '-' ],
		'<', \$w->{in}, '>', \$w->{out}, '2>', \$w->{err});
	$w->{pid} = undef;
	send_step($w, 'connecting', 'SELECT pg_backend_pid();');
}

# Send one step: SQL and psql commands, then a marker to wait for.
sub send_step
{
	my ($w, $phase, $script) = @_;
	$w->{phase} = $phase;
	$w->{in} .= "$script\n\\echo \@\@END\@\@\n";
}

# The output of the worker's step if it is complete; dies with the worker.
sub step_output
{
	my ($w) = @_;
	my $alive = eval { $w->{h}->pump_nb; $w->{h}->pumpable };
	return $1 if $w->{out} =~ s/\A(.*?)\@\@END\@\@\n//s;
	die "worker died\n" unless $alive;
	return undef;
}

# Claim (or, in-transaction, begin) the worker's current request.
sub start_attempt
{
	my ($w) = @_;
	my $req = $w->{req};
	my $label = $req->{label};
	$req->{mode} = rand() < 0.6 ? 'fenced' : 'intx';
	my $function = $req->{mode} eq 'fenced' ? 'idem_claim' : 'idem_begin';
	send_step($w, 'claim', ($req->{mode} eq 'intx' ? 'BEGIN;' : '') . qq{
SELECT outcome, coalesce(claim_id::text, ''), coalesce(generation, 0),
       coalesce(round(extract(epoch FROM retry_after) * 1000), 0),
       coalesce(convert_from(response_body, 'UTF8'), '')
  FROM $function(eo_key($label), eo_hash($label), '${LEASE_MS}ms');});
}

# The handler of an owned claim: a payment, a pause that may outlast the
# lease, the strict finalize, COMMIT.  psql reports each one's SQLSTATE.
sub run_handler
{
	my ($w, $claim_id, $generation) = @_;
	my $req = $w->{req};
	my $label = $req->{label};
	# 40% of the handlers are quick; the others outlast their lease.
	my $pause_ms = rand() < 0.4 ? rand(0.5 * $LEASE_MS) : $LEASE_MS * (1.2 + rand(1.8));
	my $pause = int($pause_ms) / 1000;
	my $before = $req->{mode} eq 'fenced' ? sprintf('SELECT pg_sleep(%.3f);', rand(0.02)) . "\nBEGIN;" : '';
	$req->{claim_id} = $claim_id;
	send_step($w, 'handler', qq{$before
INSERT INTO payments (label, claim_id, generation, mode)
VALUES ($label, '$claim_id', $generation, '$req->{mode}');
SELECT pg_sleep($pause);
SELECT idem_finalize(eo_key($label), '$claim_id', 201, NULL,
                     convert_to('paid $claim_id', 'UTF8'), strict => true);
\\echo FINALIZE :SQLSTATE
COMMIT;
\\echo COMMIT :SQLSTATE});
}

# The request is answered: record the response and take the next one.
sub answered
{
	my ($w, $body, $how) = @_;
	my $req = $w->{req};
	$responses{ $req->{request} } = [ $req->{label}, $body, $how ];
	$stats{"answered_$how"}++;
	$w->{req} = undef;
	next_request($w);
}

# Wait before retrying the current request (a follower's poll).
sub retry_later
{
	my ($w, $ms) = @_;
	$ms = 5 if $ms < 5;
	$ms = 100 if $ms > 100;
	$w->{phase} = 'waiting';
	$w->{wake_at} = time + $ms / 1000;
}

sub next_request
{
	my ($w) = @_;
	$w->{req} //= shift @{ $w->{queue} };
	if (!defined $w->{req})
	{
		$w->{phase} = 'finished';
		$w->{in} .= "\\q\n";
		eval { $w->{h}->finish };
		return;
	}
	start_attempt($w);
}

# Advance a worker whose step completed.
sub advance
{
	my ($w, $output) = @_;
	my $phase = $w->{phase};
	my $req = $w->{req};

	if ($phase eq 'connecting')
	{
		($w->{pid}) = $output =~ /^(\d+)$/m;
		next_request($w);
	}
	elsif ($phase eq 'claim')
	{
		my ($outcome, $claim_id, $generation, $retry_ms, $body) =
		  split /\|/, (split /\n/, $output)[-1] // '', -1;
		$outcome = 'error' unless defined $outcome && $outcome ne '';
		$stats{"outcome_$outcome"}++;
		if ($outcome =~ /^(claimed|recovered_ttl|recovered_abandoned)$/)
		{
			run_handler($w, $claim_id, $generation);
		}
		elsif ($outcome eq 'replay')
		{
			$w->{body} = $body;
			send_step($w, $req->{mode} eq 'intx' ? 'replay_end' : 'replayed',
				$req->{mode} eq 'intx' ? 'COMMIT;' : '');
		}
		elsif ($req->{mode} eq 'intx')
		{
			$w->{retry_ms} = $retry_ms || 10;
			send_step($w, 'rolled_back', 'ROLLBACK;');
		}
		else
		{
			retry_later($w, $retry_ms || 10);
		}
	}
	elsif ($phase eq 'replay_end' || $phase eq 'replayed')
	{
		answered($w, $w->{body}, 'replay');
	}
	elsif ($phase eq 'rolled_back')
	{
		retry_later($w, $w->{retry_ms});
	}
	elsif ($phase eq 'handler')
	{
		my ($finalize) = $output =~ /^FINALIZE (\w+)$/m;
		my ($commit) = $output =~ /^COMMIT (\w+)$/m;
		if (($finalize // '') eq '00000' && ($commit // '') eq '00000')
		{
			$stats{"executed_$req->{mode}"}++;
			answered($w, "paid $req->{claim_id}", 'executed');
		}
		else
		{
			$stats{ 'handler_failed_' . ($finalize // 'none') }++;
			retry_later($w, 5);
		}
	}
	else
	{
		die "worker $w->{id} in unexpected phase $phase";
	}
}

# Terminate the backend of a random worker, preferably one in a handler.
sub kill_one
{
	my @busy = grep { ($_->{phase} // '') eq 'handler' && $_->{pid} } @workers;
	my @any = grep { ($_->{phase} // '') ne 'finished' && $_->{pid} } @workers;
	my @pool = (@busy && rand() < 0.7) ? @busy : @any;
	return unless @pool;
	my $victim = $pool[ int(rand(@pool)) ];
	$stats{ $victim->{phase} eq 'handler' ? 'kills_in_handler' : 'kills_elsewhere' }++;
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($victim->{pid})");
}

connect_worker($_) for @workers;

my $start = time;
my $next_kill = $start + 0.3;
my $kills = 0;
while (grep { $_->{phase} ne 'finished' } @workers)
{
	for my $w (@workers)
	{
		next if $w->{phase} eq 'finished';
		if ($w->{phase} eq 'waiting')
		{
			start_attempt($w) if time >= $w->{wake_at};
			next;
		}
		my $output = eval { step_output($w) };
		if ($@)
		{
			# The connection was lost: reconnect, retry the request.
			$stats{reconnects}++;
			eval { $w->{h}->kill_kill };
			connect_worker($w);
			next;
		}
		advance($w, $output) if defined $output;
	}
	if ($kills < $MAX_KILLS && time >= $next_kill)
	{
		kill_one();
		$kills++;
		$next_kill = time + 0.1 + rand(0.2);
	}
	die sprintf('stress run did not finish in %d s: %d of %d requests answered',
		$TIME_LIMIT, scalar(keys %responses), $NREQUESTS)
	  if time - $start > $TIME_LIMIT;
	usleep(1000);
}
note sprintf('run took %.1f s; %s', time - $start,
	join(', ', map { "$_: $stats{$_}" } sort keys %stats));

is(scalar(keys %responses), $NREQUESTS, 'every request was answered');

# Record the responses where SQL can compare them with the payments.
$node->safe_psql('postgres',
	'INSERT INTO responses VALUES '
	  . join(',', map { "($_, $responses{$_}[0], '$responses{$_}[1]', '$responses{$_}[2]')" }
		  sort { $a <=> $b } keys %responses));

is( $node->safe_psql('postgres', q{
		SELECT count(*) FILTER (WHERE n = 1) || ' ' || count(*) || ' ' || sum(n)
		  FROM (SELECT label, count(*) AS n FROM payments GROUP BY label) p}),
	"$NKEYS $NKEYS $NKEYS", 'exactly one payment per key');

is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM responses r JOIN payments p USING (label)
		 WHERE r.body <> 'paid ' || p.claim_id}),
	'0', 'every response is the response of the execution that paid');

is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM payments p JOIN idem_keys k ON k.cache_key = eo_key(p.label)
		 WHERE k.state = 'completed' AND k.claim_id = p.claim_id
		   AND k.generation = p.generation
		   AND convert_from(k.response_body, 'UTF8') = 'paid ' || p.claim_id}),
	$NKEYS, 'every key is completed by the claim that paid, at its generation');

cmp_ok($stats{kills_in_handler} // 0, '>', 0, 'workers were killed mid-handler');
cmp_ok($stats{outcome_recovered_abandoned} // 0, '>', 0, 'leases were stolen');
cmp_ok($stats{handler_failed_IL001} // 0, '>', 0,
	'stale owners were refused with IL001 and rolled back');
cmp_ok($stats{answered_replay} // 0, '>', 0, 'retries were answered by replay');
is( $node->safe_psql('postgres',
		q{SELECT count(DISTINCT mode) FROM payments}) > 0 && ($stats{executed_fenced} // 0) > 0
	  && ($stats{executed_intx} // 0) > 0 ? 'both' : 'not both',
	'both',
	'handlers completed in fenced and in in-transaction mode');

$node->stop;
done_testing();
