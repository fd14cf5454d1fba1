package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// Refusal is a row the broker refused permanently, with the broker's reason.
type Refusal struct {
	ID  int64
	Err error
}

// SetAside moves the refused rows from outbox to outbox_failed in tx, keeping their error, so
// that the relay stops retrying them and the rows behind them are not held up. It must run in
// the transaction that claimed the rows (their locks make the move safe against other relays).
func SetAside(ctx context.Context, tx sqldb.DB, now time.Time, refused []Refusal) error {
	for _, r := range refused {
		msg := r.Err.Error()
		if len(msg) > 1000 {
			msg = msg[:1000]
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO outbox_failed (id, subject, payload, created_at, failed_at, attempts, error)
			SELECT id, subject, payload, created_at, ?, attempts + 1, ? FROM outbox WHERE id = ? AND published_at = `+Unpublished,
			now, msg, r.ID); err != nil {
			return fmt.Errorf("set outbox row %d aside: %w", r.ID, err)
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM outbox WHERE id = ? AND published_at = "+Unpublished, r.ID); err != nil {
			return fmt.Errorf("set outbox row %d aside: %w", r.ID, err)
		}
	}
	return nil
}

// Restore moves set-aside rows with ids in [fromID, toID] back into the outbox, unpublished,
// for an operator who fixed the cause (a raised max payload, a corrected stream). It returns how
// many rows it moved.
func Restore(ctx context.Context, db *sql.DB, fromID, toID int64) (int64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("restore outbox rows: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, `INSERT INTO outbox (id, subject, payload, created_at, attempts, last_error)
		SELECT id, subject, payload, created_at, attempts, error FROM outbox_failed WHERE id BETWEEN ? AND ?`, fromID, toID)
	if err != nil {
		return 0, fmt.Errorf("restore outbox rows: %w", err)
	}
	n, _ := res.RowsAffected()
	if _, err := tx.ExecContext(ctx, "DELETE FROM outbox_failed WHERE id BETWEEN ? AND ?", fromID, toID); err != nil {
		return 0, fmt.Errorf("restore outbox rows: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("restore outbox rows: commit: %w", err)
	}
	return n, nil
}

// PurgePublished deletes at most limit rows published before cutoff and returns how many it
// deleted. One short statement per call, in autocommit: under READ COMMITTED the range scan of
// the (published_at, id) index takes record locks on the deleted rows only, never on the
// unpublished rows (the Unpublished sentinel sorts before the range) that admissions and the relay
// touch. Callers loop while a call deletes limit rows.
func PurgePublished(ctx context.Context, db sqldb.DB, cutoff time.Time, limit int) (int64, error) {
	res, err := db.ExecContext(ctx, `DELETE FROM outbox WHERE published_at > `+Unpublished+` AND published_at < ?
		ORDER BY published_at, id LIMIT ?`, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("purge published outbox rows: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("purge published outbox rows: %w", err)
	}
	return n, nil
}

// Selection names already-published rows to replay: ids at or above FromID and, when Since is
// set, published at or after Since. The zero Selection selects every published row.
type Selection struct {
	FromID int64
	Since  *time.Time
}

// ReadPublished returns up to limit published rows of sel with ids above after, in id order.
// Paging by id is right here, unlike in the relay: the selection is of rows already published,
// and a row that commits or is published later was not part of what a consumer lost.
func ReadPublished(ctx context.Context, q sqldb.DB, sel Selection, after int64, limit int) ([]Row, error) {
	query := `SELECT id, subject, payload, created_at, attempts FROM outbox
		WHERE id > ? AND id >= ? AND published_at > ` + Unpublished
	args := []any{after, sel.FromID}
	if sel.Since != nil {
		query += " AND published_at >= ?"
		args = append(args, *sel.Since)
	}
	query += " ORDER BY id LIMIT ?"
	args = append(args, limit)
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("read published outbox rows: %w", err)
	}
	out, err := scanRows(rows)
	if err != nil {
		return nil, fmt.Errorf("read published outbox rows: %w", err)
	}
	return out, nil
}

// CountPublished returns how many rows sel selects now.
func CountPublished(ctx context.Context, q sqldb.DB, sel Selection) (int64, error) {
	query := "SELECT COUNT(*) FROM outbox WHERE id >= ? AND published_at > " + Unpublished
	args := []any{sel.FromID}
	if sel.Since != nil {
		query += " AND published_at >= ?"
		args = append(args, *sel.Since)
	}
	var n int64
	if err := q.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count published outbox rows: %w", err)
	}
	return n, nil
}

// Failed is a set-aside row as `sluice outbox status` shows it.
type Failed struct {
	ID       int64
	Subject  string
	Size     int
	FailedAt time.Time
	Error    string
}

// ReadFailed returns the number of set-aside rows and up to limit of the newest ones.
func ReadFailed(ctx context.Context, q sqldb.DB, limit int) (int64, []Failed, error) {
	var n int64
	if err := q.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox_failed").Scan(&n); err != nil {
		return 0, nil, fmt.Errorf("read set-aside outbox rows: %w", err)
	}
	rows, err := q.QueryContext(ctx, `SELECT id, subject, LENGTH(payload), failed_at, error FROM outbox_failed
		ORDER BY id DESC LIMIT ?`, limit)
	if err != nil {
		return 0, nil, fmt.Errorf("read set-aside outbox rows: %w", err)
	}
	defer rows.Close()
	var out []Failed
	for rows.Next() {
		var f Failed
		if err := rows.Scan(&f.ID, &f.Subject, &f.Size, &f.FailedAt, &f.Error); err != nil {
			return 0, nil, fmt.Errorf("read set-aside outbox rows: %w", err)
		}
		out = append(out, f)
	}
	return n, out, rows.Err()
}
