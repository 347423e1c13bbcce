# pg_idem: PGXS build of the extension, and the project's entry points.
#
#   make            build the extension          make install   install it
#   make test       everything, on a throwaway cluster (tests/run.sh)
#   make demo       the walkthrough on a throwaway cluster (tests/demo.sh)
#   make bench      the benchmarks (tests/bench/run.sh)

.DEFAULT_GOAL := all

EXT         = pg_idem
EXTVERSION  = $(shell sed -n "s/^default_version *= *'\(.*\)'.*/\1/p" extension/$(EXT).control)

MODULE_big  = $(EXT)
OBJS        = $(patsubst %.c,%.o,$(sort $(wildcard extension/*.c)))
PG_CPPFLAGS = -I$(srcdir)/extension
PG_CFLAGS   = -Werror=implicit-function-declaration

# The install script is assembled from one file per concern; upgrade
# scripts are kept as written, one per release step.
MODULEDIR   = extension
DATA        = extension/$(EXT).control $(wildcard extension/upgrades/$(EXT)--*--*.sql)
DATA_built  = $(EXT)--$(EXTVERSION).sql
EXTRA_CLEAN = $(EXT)--*.sql results regression.diffs regression.out \
              output_iso tmp_check

# Tests are discovered: drop foo.sql + expected/foo.out, or a spec + its
# expected output, or a TAP script in place.
REGRESS      = $(sort $(patsubst sql/%.sql,%,$(wildcard sql/*.sql)))
REGRESS_OPTS = --load-extension=$(EXT)
ISOLATION    = $(sort $(patsubst tests/isolation/specs/%.spec,%,$(wildcard tests/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=tests/isolation --load-extension=$(EXT)
TAP_TESTS    = 1
PROVE_TESTS  = $(sort $(wildcard tests/t/*.pl))

$(EXT)--$(EXTVERSION).sql: $(sort $(wildcard extension/sql/*.sql))
	{ echo '-- generated from extension/sql/*.sql: edit those files'; \
	  printf '%s\n' '\echo Use "CREATE EXTENSION $(EXT)" to load this file. \quit'; \
	  for f in $^; do echo; echo "-- $$f"; cat $$f; done; } > $@

$(OBJS): $(wildcard extension/*.h)

.PHONY: test demo bench
test:
	bash tests/run.sh
demo:
	bash tests/demo.sh
bench:
	bash tests/bench/run.sh $(MODE)

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
