-- Users log in with a phone number; the first login creates the row.
CREATE TABLE IF NOT EXISTS users (
    id         BIGINT      NOT NULL AUTO_INCREMENT,
    phone      VARCHAR(20) NOT NULL,
    created_at DATETIME    NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uk_users_phone (phone)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- stock is the stock left. The CHECK is a last guard under the guarded
-- UPDATE ... WHERE stock > 0: even a buggy statement cannot store a
-- negative stock.
CREATE TABLE IF NOT EXISTS vouchers (
    id            BIGINT       NOT NULL AUTO_INCREMENT,
    title         VARCHAR(255) NOT NULL,
    stock         INT          NOT NULL,
    initial_stock INT          NOT NULL,
    begin_time    DATETIME     NOT NULL,
    end_time      DATETIME     NOT NULL,
    created_at    DATETIME     NOT NULL,
    PRIMARY KEY (id),
    CONSTRAINT chk_vouchers_stock CHECK (stock >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- id comes from internal/idworker, not AUTO_INCREMENT. The unique index on
-- (user_id, voucher_id) is the one-order-per-user rule's final guard: two
-- instances racing for the same user cannot both insert.
CREATE TABLE IF NOT EXISTS voucher_orders (
    id         BIGINT      NOT NULL,
    user_id    BIGINT      NOT NULL,
    voucher_id BIGINT      NOT NULL,
    status     VARCHAR(16) NOT NULL DEFAULT 'created',
    created_at DATETIME(3) NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uk_voucher_orders_user_voucher (user_id, voucher_id),
    KEY idx_voucher_orders_voucher (voucher_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
