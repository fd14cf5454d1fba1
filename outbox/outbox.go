// Package outbox is sluice's transactional outbox (SPEC §3, §7). A message to NATS is first a
// row written inside the transaction of the change it announces; the relay publishes committed
// rows and marks them published after the broker acknowledged them. Nothing here talks to NATS.
package outbox

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// Kind names what a poke announces. It is the second token of the subject.
type Kind string

const (
	// Enqueue announces a job that became queued (admission, requeue).
	Enqueue Kind = "enqueue"
	// Release announces capacity that freed up (a job left the in-flight states).
	Release Kind = "release"
)

// Unpublished is the published_at of a row the broker has not acknowledged yet, as an SQL
// literal. A NOT NULL sentinel rather than NULL, so that marking a row published updates it in
// place (migration 0007 says why); it sorts before every real publication time.
const Unpublished = "'1000-01-01 00:00:00'"

// DefaultPrefix is the subject prefix when none is configured.
const DefaultPrefix = "sluice"

// CheckPrefix returns an error unless prefix can start a subject: no spaces, wildcards or
// control whitespace, and no leading or trailing '.'. Writers that take a configured prefix
// check it with this, so that they agree with the relay on what a subject is.
func CheckPrefix(prefix string) error {
	if strings.ContainsAny(prefix, " *>\t\r\n") || strings.HasPrefix(prefix, ".") || strings.HasSuffix(prefix, ".") {
		return fmt.Errorf("%q is not a valid subject prefix", prefix)
	}
	return nil
}

// Subject returns the NATS subject for a poke of kind about tenant: <prefix>.<kind>.<token>,
// where the token is the unpadded base64url encoding of the tenant's bytes, because tenants may
// contain '.', '*', '>' or spaces, which subjects cannot.
func Subject(prefix string, kind Kind, tenant string) string {
	return prefix + "." + string(kind) + "." + base64.RawURLEncoding.EncodeToString([]byte(tenant))
}

// ParseSubject is the inverse of Subject.
func ParseSubject(prefix, subject string) (Kind, string, error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return "", "", fmt.Errorf("subject %q: prefix is not %q", subject, prefix)
	}
	kind, token, ok := strings.Cut(rest, ".")
	if !ok {
		return "", "", fmt.Errorf("subject %q: want <prefix>.<kind>.<tenant token>", subject)
	}
	tenant, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return "", "", fmt.Errorf("subject %q: tenant token: %w", subject, err)
	}
	return Kind(kind), string(tenant), nil
}

// Poke is the body of an enqueue or release message.
type Poke struct {
	Kind   Kind   `json:"kind"`
	Tenant string `json:"tenant"`
	JobID  int64  `json:"job_id"`
}

// PokeJobID returns the job a poke's body names, or 0 when it names none (a slot's or a
// capacity release's poke) or is not a poke's body.
func PokeJobID(body []byte) int64 {
	var p Poke
	if json.Unmarshal(body, &p) != nil || p.JobID < 0 {
		return 0
	}
	return p.JobID
}

// Message is one row to write.
type Message struct {
	Subject string
	Payload []byte
}

// PokeMessage builds the message announcing a poke.
func PokeMessage(prefix string, kind Kind, tenant string, jobID int64) Message {
	body, _ := json.Marshal(Poke{Kind: kind, Tenant: tenant, JobID: jobID}) // cannot fail
	return Message{Subject: Subject(prefix, kind, tenant), Payload: body}
}

// NewPoke is an enqueue or release poke about a job that the same transaction inserted earlier
// in the same round trip: its id is only known to the server then.
type NewPoke struct {
	Kind   Kind
	Tenant string
	// Offset is the job's id less the first id of the transaction's last INSERT into jobs,
	// LAST_INSERT_ID(): the job's place among that INSERT's rows times the session's
	// auto_increment_increment.
	Offset int64
}

// InsertPokes returns one INSERT statement and its arguments that write pokes, for a
// multi-statement round trip that runs it right after the INSERT into jobs the pokes are about.
// Each body is built by the server around LAST_INSERT_ID(), byte for byte what PokeMessage
// builds for the same id.
func InsertPokes(prefix string, now time.Time, pokes []NewPoke) (string, []any) {
	args := make([]any, 0, 5*len(pokes))
	for _, p := range pokes {
		head, tail := pokeBodyAround(p.Kind, p.Tenant)
		args = append(args, Subject(prefix, p.Kind, p.Tenant), head, p.Offset, tail, now)
	}
	return insertSQL("(?, CONCAT(?, LAST_INSERT_ID() + ?, ?), ?)", len(pokes)), args
}

// insertSQL is the INSERT of n outbox rows, each given by row.
func insertSQL(row string, n int) string {
	return "INSERT INTO outbox (subject, payload, created_at) VALUES " + strings.TrimSuffix(strings.Repeat(row+",", n), ",")
}

// pokeBodyAround returns the parts of a poke body around its job id, which JSON encodes last.
func pokeBodyAround(kind Kind, tenant string) (head, tail []byte) {
	body, _ := json.Marshal(Poke{Kind: kind, Tenant: tenant}) // cannot fail
	return body[:len(body)-2], body[len(body)-1:]             // body ends in `0}`
}

// Insert returns the one statement, with its arguments, that inserts msgs (at least one), for a
// caller that sends it together with other statements.
func Insert(now time.Time, msgs ...Message) (string, []any) {
	args := make([]any, 0, 3*len(msgs))
	for _, m := range msgs {
		args = append(args, m.Subject, m.Payload, now)
	}
	return insertSQL("(?,?,?)", len(msgs)), args
}

// Write inserts msgs in one statement inside tx and returns their row ids in order. now is the
// transaction's timestamp. tx is a transaction or a connection: several messages read the
// session's auto_increment_increment after the INSERT. The rows become visible to the relay
// when tx commits, not before.
func Write(ctx context.Context, tx sqldb.DB, now time.Time, msgs ...Message) ([]int64, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	q, args := Insert(now, msgs...)
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("write outbox: %w", err)
	}
	first, err := res.LastInsertId()
	if err != nil {
		return nil, fmt.Errorf("write outbox: id: %w", err)
	}
	// A multi-row INSERT with a known row count reserves its ids at once under every InnoDB
	// auto-increment lock mode ("simple inserts"), first, first+step, ..., where the step is
	// the session's auto_increment_increment: Galera sets it to the cluster size.
	step := int64(1)
	if len(msgs) > 1 {
		if err := tx.QueryRowContext(ctx, "SELECT @@SESSION.auto_increment_increment").Scan(&step); err != nil {
			return nil, fmt.Errorf("write outbox: auto_increment_increment: %w", err)
		}
	}
	ids := make([]int64, len(msgs))
	for i := range ids {
		ids[i] = first + int64(i)*step
	}
	return ids, nil
}

// Row is an outbox row as the relay reads it.
type Row struct {
	ID        int64
	Subject   string
	Payload   []byte
	CreatedAt time.Time
	Attempts  int
}

// ClaimUnpublished locks up to limit unpublished rows, oldest id first, and returns them. It must
// run in a transaction; the row locks are held until that transaction ends. SKIP LOCKED lets
// several relays run at once, each taking rows no other relay holds, and the selection is by
// state (published_at = Unpublished), never by an id high-water mark, because ids are assigned at
// INSERT but rows become visible at COMMIT, out of id order.
func ClaimUnpublished(ctx context.Context, tx *sql.Tx, limit int) ([]Row, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id, subject, payload, created_at, attempts FROM outbox
		WHERE published_at = `+Unpublished+` ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED`, limit)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	out, err := scanRows(rows)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	return out, nil
}

// scanRows reads and closes rows selected as id, subject, payload, created_at, attempts.
func scanRows(rows *sql.Rows) ([]Row, error) {
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.ID, &r.Subject, &r.Payload, &r.CreatedAt, &r.Attempts); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// MarkPublished records that the broker acknowledged the rows ids at now. Rows already marked
// keep their first publication time.
func MarkPublished(ctx context.Context, tx sqldb.DB, now time.Time, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	q := "UPDATE outbox SET published_at = ? WHERE published_at = " + Unpublished + " AND id IN (" + placeholders(len(ids)) + ")"
	args := make([]any, 0, len(ids)+1)
	args = append(args, now)
	for _, id := range ids {
		args = append(args, id)
	}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("mark outbox rows published: %w", err)
	}
	return nil
}

// Stats is the outbox backlog.
type Stats struct {
	Unpublished       int64
	OldestUnpublished *time.Time
	OldestAgeSeconds  float64
}

// ReadStats returns the number of unpublished rows and the age of the oldest one relative to now.
func ReadStats(ctx context.Context, q sqldb.DB, now time.Time) (Stats, error) {
	var s Stats
	var oldest sql.NullTime
	if err := q.QueryRowContext(ctx,
		"SELECT COUNT(*), MIN(created_at) FROM outbox WHERE published_at = "+Unpublished).Scan(&s.Unpublished, &oldest); err != nil {
		return s, fmt.Errorf("read outbox stats: %w", err)
	}
	if oldest.Valid {
		t := oldest.Time
		s.OldestUnpublished = &t
		if age := now.Sub(t).Seconds(); age > 0 {
			s.OldestAgeSeconds = age
		}
	}
	return s, nil
}

func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}
