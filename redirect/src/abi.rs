//! Kernel ABI constants used by the hand-rolled netlink encoder.
//!
//! Values are copied from the uapi headers (`linux/netlink.h`,
//! `linux/rtnetlink.h`, `linux/fib_rules.h`, `linux/netfilter.h`,
//! `linux/netfilter/nfnetlink.h`, `linux/netfilter/nf_tables.h`,
//! `linux/netfilter/nf_nat.h`) and are stable ABI. The unit tests at the end
//! cross-check every value that the `libc` crate also exports; the rest were
//! checked against the headers with a C program when this file was written.

// ---- netlink (linux/netlink.h) ----
pub(crate) const NLMSG_HDRLEN: usize = 16;
pub(crate) const NLA_HDRLEN: usize = 4;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;
pub(crate) const NLMSG_MIN_TYPE: u16 = 0x10;
pub(crate) const NLM_F_REQUEST: u16 = 0x01;
pub(crate) const NLM_F_ACK: u16 = 0x04;
pub(crate) const NLM_F_DUMP_INTR: u16 = 0x10;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;
pub(crate) const NLA_F_NESTED: u16 = 1 << 15;
pub(crate) const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
pub(crate) const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

// ---- rtnetlink (linux/rtnetlink.h, linux/if_link.h, linux/fib_rules.h) ----
pub(crate) const RTM_NEWLINK: u16 = 16;
pub(crate) const RTM_GETLINK: u16 = 18;
pub(crate) const RTM_NEWROUTE: u16 = 24;
pub(crate) const RTM_DELROUTE: u16 = 25;
pub(crate) const RTM_GETROUTE: u16 = 26;
pub(crate) const RTM_NEWRULE: u16 = 32;
pub(crate) const RTM_DELRULE: u16 = 33;
pub(crate) const RTM_GETRULE: u16 = 34;
pub(crate) const RTA_OIF: u16 = 4;
pub(crate) const RTA_TABLE: u16 = 15;
pub(crate) const RTN_LOCAL: u8 = 2;
pub(crate) const RTPROT_STATIC: u8 = 4;
pub(crate) const RT_SCOPE_HOST: u8 = 254;
pub(crate) const RT_SCOPE_NOWHERE: u8 = 255;
pub(crate) const RT_TABLE_UNSPEC: u8 = 0;
pub(crate) const FRA_PRIORITY: u16 = 6;
pub(crate) const FRA_FWMARK: u16 = 10;
pub(crate) const FRA_TABLE: u16 = 15;
pub(crate) const FRA_FWMASK: u16 = 16;
pub(crate) const FR_ACT_TO_TBL: u8 = 1;
pub(crate) const IFF_UP: u32 = 0x1;
pub(crate) const AF_UNSPEC: u8 = 0;
pub(crate) const AF_INET: u8 = 2;
pub(crate) const AF_INET6: u8 = 10;
/// The loopback device is always registered first in a network namespace.
pub(crate) const LOOPBACK_IFINDEX: u32 = 1;

// ---- netfilter (linux/netfilter.h, nfnetlink.h) ----
pub(crate) const NFPROTO_UNSPEC: u8 = 0;
pub(crate) const NFPROTO_INET: u8 = 1;
pub(crate) const NFPROTO_IPV4: u8 = 2;
pub(crate) const NFPROTO_IPV6: u8 = 10;
pub(crate) const NF_DROP: i32 = 0;
pub(crate) const NF_ACCEPT: i32 = 1;
pub(crate) const NF_INET_PRE_ROUTING: u32 = 0;
pub(crate) const NF_INET_LOCAL_OUT: u32 = 3;
pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(crate) const NFNL_MSG_BATCH_BEGIN: u16 = NLMSG_MIN_TYPE;
pub(crate) const NFNL_MSG_BATCH_END: u16 = NLMSG_MIN_TYPE + 1;
pub(crate) const NFNETLINK_V0: u8 = 0;
pub(crate) const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 1 << 1;
pub(crate) const IP_CT_DIR_ORIGINAL: u8 = 0;
pub(crate) const IP_CT_DIR_REPLY: u8 = 1;
pub(crate) const IPPROTO_TCP: u8 = 6;

// ---- nf_tables (linux/netfilter/nf_tables.h) ----
pub(crate) const NFT_MSG_NEWTABLE: u16 = 0;
pub(crate) const NFT_MSG_GETTABLE: u16 = 1;
pub(crate) const NFT_MSG_DELTABLE: u16 = 2;
pub(crate) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(crate) const NFT_MSG_GETCHAIN: u16 = 4;
pub(crate) const NFT_MSG_NEWRULE: u16 = 6;
pub(crate) const NFT_MSG_GETRULE: u16 = 7;

pub(crate) const NFT_REG_VERDICT: u32 = 0;
pub(crate) const NFT_REG_1: u32 = 1;
pub(crate) const NFT_REG_2: u32 = 2;
/// The second 32-bit slot of register 1 (bytes 4..8 of `NFT_REG_1`).
pub(crate) const NFT_REG32_01: u32 = 9;
pub(crate) const NFT_REG32_03: u32 = 11;
pub(crate) const NFT_REG32_05: u32 = 13;
pub(crate) const NFT_RETURN: i32 = -5;

pub(crate) const NFTA_LIST_ELEM: u16 = 1;

pub(crate) const NFTA_HOOK_HOOKNUM: u16 = 1;
pub(crate) const NFTA_HOOK_PRIORITY: u16 = 2;

pub(crate) const NFTA_TABLE_NAME: u16 = 1;
pub(crate) const NFTA_TABLE_FLAGS: u16 = 2;
/// Table user data (kernel 5.13+); `nft list` shows a comment TLV in it.
pub(crate) const NFTA_TABLE_USERDATA: u16 = 6;

pub(crate) const NFTA_CHAIN_TABLE: u16 = 1;
pub(crate) const NFTA_CHAIN_NAME: u16 = 3;
pub(crate) const NFTA_CHAIN_HOOK: u16 = 4;
pub(crate) const NFTA_CHAIN_POLICY: u16 = 5;
pub(crate) const NFTA_CHAIN_TYPE: u16 = 7;
/// Chain user data (kernel 5.10+).
pub(crate) const NFTA_CHAIN_USERDATA: u16 = 12;

pub(crate) const NFTA_RULE_TABLE: u16 = 1;
pub(crate) const NFTA_RULE_CHAIN: u16 = 2;
pub(crate) const NFTA_RULE_HANDLE: u16 = 3;
pub(crate) const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub(crate) const NFTA_RULE_USERDATA: u16 = 7;

pub(crate) const NFTA_EXPR_NAME: u16 = 1;
pub(crate) const NFTA_EXPR_DATA: u16 = 2;

pub(crate) const NFTA_DATA_VALUE: u16 = 1;
pub(crate) const NFTA_DATA_VERDICT: u16 = 2;
pub(crate) const NFTA_VERDICT_CODE: u16 = 1;

pub(crate) const NFTA_IMMEDIATE_DREG: u16 = 1;
pub(crate) const NFTA_IMMEDIATE_DATA: u16 = 2;

pub(crate) const NFTA_BITWISE_SREG: u16 = 1;
pub(crate) const NFTA_BITWISE_DREG: u16 = 2;
pub(crate) const NFTA_BITWISE_LEN: u16 = 3;
pub(crate) const NFTA_BITWISE_MASK: u16 = 4;
pub(crate) const NFTA_BITWISE_XOR: u16 = 5;

pub(crate) const NFT_CMP_EQ: u32 = 0;
pub(crate) const NFT_CMP_NEQ: u32 = 1;
pub(crate) const NFTA_CMP_SREG: u16 = 1;
pub(crate) const NFTA_CMP_OP: u16 = 2;
pub(crate) const NFTA_CMP_DATA: u16 = 3;

pub(crate) const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub(crate) const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
pub(crate) const NFTA_PAYLOAD_DREG: u16 = 1;
pub(crate) const NFTA_PAYLOAD_BASE: u16 = 2;
pub(crate) const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub(crate) const NFTA_PAYLOAD_LEN: u16 = 4;

pub(crate) const NFT_META_MARK: u32 = 3;
pub(crate) const NFT_META_IIF: u32 = 4;
pub(crate) const NFT_META_OIF: u32 = 5;
pub(crate) const NFT_META_NFPROTO: u32 = 15;
pub(crate) const NFT_META_L4PROTO: u32 = 16;
pub(crate) const NFTA_META_DREG: u16 = 1;
pub(crate) const NFTA_META_KEY: u16 = 2;
pub(crate) const NFTA_META_SREG: u16 = 3;

pub(crate) const NFT_SOCKET_TRANSPARENT: u32 = 0;
pub(crate) const NFTA_SOCKET_KEY: u16 = 1;
pub(crate) const NFTA_SOCKET_DREG: u16 = 2;

pub(crate) const NFT_CT_DIRECTION: u32 = 1;
pub(crate) const NFT_CT_MARK: u32 = 3;
pub(crate) const NFTA_CT_DREG: u16 = 1;
pub(crate) const NFTA_CT_KEY: u16 = 2;
pub(crate) const NFTA_CT_SREG: u16 = 4;

pub(crate) const NFTA_TPROXY_FAMILY: u16 = 1;
pub(crate) const NFTA_TPROXY_REG_PORT: u16 = 3;

pub(crate) const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;
pub(crate) const NFTA_REDIR_FLAGS: u16 = 3;

pub(crate) const NFTA_HASH_SREG: u16 = 1;
pub(crate) const NFTA_HASH_DREG: u16 = 2;
pub(crate) const NFTA_HASH_LEN: u16 = 3;
pub(crate) const NFTA_HASH_MODULUS: u16 = 4;
pub(crate) const NFTA_HASH_SEED: u16 = 5;
pub(crate) const NFTA_HASH_OFFSET: u16 = 6;
pub(crate) const NFTA_HASH_TYPE: u16 = 7;
pub(crate) const NFT_HASH_JENKINS: u32 = 0;

pub(crate) const NFTA_BYTEORDER_SREG: u16 = 1;
pub(crate) const NFTA_BYTEORDER_DREG: u16 = 2;
pub(crate) const NFTA_BYTEORDER_OP: u16 = 3;
pub(crate) const NFTA_BYTEORDER_LEN: u16 = 4;
pub(crate) const NFTA_BYTEORDER_SIZE: u16 = 5;
pub(crate) const NFT_BYTEORDER_HTON: u32 = 1;

pub(crate) const NFTA_NAT_TYPE: u16 = 1;
pub(crate) const NFTA_NAT_FAMILY: u16 = 2;
pub(crate) const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub(crate) const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub(crate) const NFT_NAT_DNAT: u32 = 1;

/// libnftnl's user-data TLV type for a rule comment (`NFTNL_UDATA_RULE_COMMENT`);
/// `nft list` shows it as `comment "..."`.
pub(crate) const NFTNL_UDATA_RULE_COMMENT: u8 = 0;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every constant that libc also exports must agree with it.
    #[test]
    fn constants_match_libc() {
        assert_eq!(NLMSG_ERROR as i32, libc::NLMSG_ERROR);
        assert_eq!(NLMSG_DONE as i32, libc::NLMSG_DONE);
        assert_eq!(NLMSG_MIN_TYPE as i32, libc::NLMSG_MIN_TYPE);
        assert_eq!(NLM_F_REQUEST as i32, libc::NLM_F_REQUEST);
        assert_eq!(NLM_F_ACK as i32, libc::NLM_F_ACK);
        assert_eq!(NLM_F_DUMP_INTR as i32, libc::NLM_F_DUMP_INTR);
        assert_eq!(NLM_F_DUMP as i32, libc::NLM_F_DUMP);
        assert_eq!(NLM_F_EXCL as i32, libc::NLM_F_EXCL);
        assert_eq!(NLM_F_CREATE as i32, libc::NLM_F_CREATE);
        assert_eq!(NLM_F_APPEND as i32, libc::NLM_F_APPEND);
        assert_eq!(NLA_F_NESTED as i32, libc::NLA_F_NESTED);
        assert_eq!(NLA_F_NET_BYTEORDER as i32, libc::NLA_F_NET_BYTEORDER);

        assert_eq!(RTM_NEWLINK, libc::RTM_NEWLINK);
        assert_eq!(RTM_GETLINK, libc::RTM_GETLINK);
        assert_eq!(RTM_NEWROUTE, libc::RTM_NEWROUTE);
        assert_eq!(RTM_DELROUTE, libc::RTM_DELROUTE);
        assert_eq!(RTM_GETROUTE, libc::RTM_GETROUTE);
        assert_eq!(RTM_NEWRULE, libc::RTM_NEWRULE);
        assert_eq!(RTM_DELRULE, libc::RTM_DELRULE);
        assert_eq!(RTM_GETRULE, libc::RTM_GETRULE);
        assert_eq!(RTA_OIF, libc::RTA_OIF);
        assert_eq!(RTA_TABLE, libc::RTA_TABLE);
        assert_eq!(RTN_LOCAL, libc::RTN_LOCAL);
        assert_eq!(RTPROT_STATIC, libc::RTPROT_STATIC);
        assert_eq!(RT_SCOPE_HOST, libc::RT_SCOPE_HOST);
        assert_eq!(RT_SCOPE_NOWHERE, libc::RT_SCOPE_NOWHERE);
        assert_eq!(RT_TABLE_UNSPEC, libc::RT_TABLE_UNSPEC);
        assert_eq!(IFF_UP as i32, libc::IFF_UP);
        assert_eq!(AF_UNSPEC as i32, libc::AF_UNSPEC);
        assert_eq!(AF_INET as i32, libc::AF_INET);
        assert_eq!(AF_INET6 as i32, libc::AF_INET6);

        assert_eq!(NFPROTO_UNSPEC as i32, libc::NFPROTO_UNSPEC);
        assert_eq!(NFPROTO_INET as i32, libc::NFPROTO_INET);
        assert_eq!(NFPROTO_IPV4 as i32, libc::NFPROTO_IPV4);
        assert_eq!(NFPROTO_IPV6 as i32, libc::NFPROTO_IPV6);
        assert_eq!(NF_DROP, libc::NF_DROP);
        assert_eq!(NF_ACCEPT, libc::NF_ACCEPT);
        assert_eq!(NF_INET_PRE_ROUTING as i32, libc::NF_INET_PRE_ROUTING);
        assert_eq!(NF_INET_LOCAL_OUT as i32, libc::NF_INET_LOCAL_OUT);
        assert_eq!(NFNL_SUBSYS_NFTABLES as i32, libc::NFNL_SUBSYS_NFTABLES);
        assert_eq!(NFNL_MSG_BATCH_BEGIN as i32, libc::NFNL_MSG_BATCH_BEGIN);
        assert_eq!(NFNL_MSG_BATCH_END as i32, libc::NFNL_MSG_BATCH_END);
        assert_eq!(NFNETLINK_V0 as i32, libc::NFNETLINK_V0);
        assert_eq!(IPPROTO_TCP as i32, libc::IPPROTO_TCP);

        assert_eq!(NFT_MSG_NEWTABLE as i32, libc::NFT_MSG_NEWTABLE);
        assert_eq!(NFT_MSG_GETTABLE as i32, libc::NFT_MSG_GETTABLE);
        assert_eq!(NFT_MSG_DELTABLE as i32, libc::NFT_MSG_DELTABLE);
        assert_eq!(NFT_MSG_NEWCHAIN as i32, libc::NFT_MSG_NEWCHAIN);
        assert_eq!(NFT_MSG_GETCHAIN as i32, libc::NFT_MSG_GETCHAIN);
        assert_eq!(NFT_MSG_NEWRULE as i32, libc::NFT_MSG_NEWRULE);
        assert_eq!(NFT_MSG_GETRULE as i32, libc::NFT_MSG_GETRULE);
        assert_eq!(NFT_REG_VERDICT as i32, libc::NFT_REG_VERDICT);
        assert_eq!(NFT_REG_1 as i32, libc::NFT_REG_1);
        assert_eq!(NFT_REG_2 as i32, libc::NFT_REG_2);
        assert_eq!(NFT_REG32_01 as i32, libc::NFT_REG32_01);
        assert_eq!(NFT_REG32_03 as i32, libc::NFT_REG32_03);
        assert_eq!(NFT_REG32_05 as i32, libc::NFT_REG32_05);
        assert_eq!(NFT_BYTEORDER_HTON as i32, libc::NFT_BYTEORDER_HTON);
        assert_eq!(NFT_NAT_DNAT as i32, libc::NFT_NAT_DNAT);
        assert_eq!(NFT_RETURN, libc::NFT_RETURN);
        assert_eq!(NFT_CMP_EQ as i32, libc::NFT_CMP_EQ);
        assert_eq!(NFT_CMP_NEQ as i32, libc::NFT_CMP_NEQ);
        assert_eq!(
            NFT_PAYLOAD_NETWORK_HEADER as i32,
            libc::NFT_PAYLOAD_NETWORK_HEADER
        );
        assert_eq!(
            NFT_PAYLOAD_TRANSPORT_HEADER as i32,
            libc::NFT_PAYLOAD_TRANSPORT_HEADER
        );
        assert_eq!(NFT_META_MARK as i32, libc::NFT_META_MARK);
        assert_eq!(NFT_META_IIF as i32, libc::NFT_META_IIF);
        assert_eq!(NFT_META_OIF as i32, libc::NFT_META_OIF);
        assert_eq!(NFT_META_NFPROTO as i32, libc::NFT_META_NFPROTO);
        assert_eq!(NFT_META_L4PROTO as i32, libc::NFT_META_L4PROTO);
        assert_eq!(NFT_CT_DIRECTION as i32, libc::NFT_CT_DIRECTION);
        assert_eq!(NFT_CT_MARK as i32, libc::NFT_CT_MARK);
    }
}
