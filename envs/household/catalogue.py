"""What exists in a household: object kinds, receptacle kinds, what holds what, and room kinds.

The names are ALFWorld's (lower-case AI2-THOR class names), so that observations read like
ALFWorld's and a task exports to ALFWorld's PDDL domain unchanged. Object properties follow the
receptacles, as in ALFRED: an object is cleanable if a sink basin can hold it, heatable if a
microwave can, coolable if a fridge can.
"""

from __future__ import annotations

from dataclasses import dataclass

FOOD = frozenset({"apple", "bread", "egg", "lettuce", "potato", "tomato"})
DISH = frozenset({"mug", "cup", "bowl", "plate"})
COOKWARE = frozenset({"pan", "pot", "kettle"})
UTENSIL = frozenset({"fork", "spoon", "knife", "butterknife", "spatula", "ladle"})
KITCHEN_MISC = frozenset({"saltshaker", "peppershaker", "dishsponge", "winebottle", "soapbottle", "spraybottle"})
SMALL_OFFICE = frozenset({"cellphone", "creditcard", "keychain", "pen", "pencil", "cd", "watch"})
OFFICE = SMALL_OFFICE | {"book", "laptop", "remotecontrol", "newspaper", "alarmclock"}
DECOR = frozenset({"statue", "vase", "box", "candle", "tissuebox"})
BATH = frozenset({"soapbar", "soapbottle", "spraybottle", "toiletpaper", "towel", "handtowel", "cloth", "candle"})

# Objects that are themselves containers in ALFRED; examining one lists its (always empty) contents.
RECEPTACLE_OBJECTS = frozenset({"bowl", "box", "cup", "mug", "plate", "pan", "pot"})
SLICEABLE = frozenset({"apple", "bread", "lettuce", "potato", "tomato"})
SHARP = frozenset({"knife", "butterknife"})
LIGHTS = frozenset({"desklamp"})

# Receptacle kind -> the object kinds it can hold (ALFRED's canContain).
CAN_CONTAIN: dict[str, frozenset[str]] = {
    "countertop": FOOD | DISH | COOKWARE | UTENSIL | KITCHEN_MISC | {"cellphone", "creditcard", "book", "vase", "statue"},
    "diningtable": FOOD | DISH | COOKWARE | UTENSIL | KITCHEN_MISC | OFFICE | DECOR,
    "cabinet": DISH | COOKWARE | KITCHEN_MISC | {"soapbar", "toiletpaper", "cloth", "candle", "book", "vase", "box"},
    "drawer": UTENSIL | SMALL_OFFICE | {"dishsponge", "book", "remotecontrol", "cloth", "soapbar", "toiletpaper", "candle"},
    "fridge": FOOD | DISH | {"pan", "pot", "winebottle"},
    "microwave": FOOD | DISH,
    "sinkbasin": FOOD | DISH | COOKWARE | UTENSIL | {"dishsponge", "soapbar", "cloth"},
    "stoveburner": COOKWARE,
    "coffeemachine": frozenset({"mug"}),
    "toaster": frozenset(),
    "garbagecan": FOOD | {"soapbottle", "spraybottle", "toiletpaper", "newspaper", "cd", "pencil", "pen", "cloth", "soapbar", "tissuebox", "winebottle"},
    "shelf": DISH | KITCHEN_MISC | OFFICE | DECOR | {"soapbar", "toiletpaper", "cloth"},
    "desk": OFFICE | DECOR | {"mug", "cup", "bowl"},
    "sidetable": OFFICE | DECOR | {"mug", "cup", "bowl"},
    "dresser": OFFICE | DECOR,
    "coffeetable": OFFICE | DECOR | {"mug", "cup", "bowl", "plate"},
    "bed": frozenset({"pillow", "laptop", "book", "cellphone", "creditcard", "keychain", "remotecontrol", "newspaper"}),
    "sofa": frozenset({"pillow", "laptop", "book", "cellphone", "creditcard", "keychain", "remotecontrol", "newspaper", "box"}),
    "armchair": frozenset({"pillow", "laptop", "book", "cellphone", "creditcard", "keychain", "remotecontrol", "newspaper"}),
    "safe": frozenset({"cellphone", "creditcard", "keychain", "cd", "watch", "statue", "vase"}),
    "toilet": frozenset({"soapbottle", "spraybottle", "soapbar", "toiletpaper", "candle", "cloth"}),
    "bathtubbasin": frozenset({"soapbar", "soapbottle", "cloth"}),
    "towelholder": frozenset({"towel"}),
    "handtowelholder": frozenset({"handtowel"}),
    "toiletpaperhanger": frozenset({"toiletpaper"}),
}
OPENABLE = frozenset({"cabinet", "drawer", "fridge", "microwave", "safe"})
# Where a desk lamp stands in a room.
LAMP_HOSTS = ("desk", "sidetable", "dresser")

CLEANABLE = CAN_CONTAIN["sinkbasin"]
HEATABLE = CAN_CONTAIN["microwave"]
COOLABLE = CAN_CONTAIN["fridge"]

# ALFRED's CamelCase type names, for the PDDL export.
PDDL_TYPE_NAMES: dict[str, str] = {
    "alarmclock": "AlarmClock", "armchair": "ArmChair", "bathtubbasin": "BathtubBasin",
    "butterknife": "ButterKnife", "coffeemachine": "CoffeeMachine", "coffeetable": "CoffeeTable",
    "countertop": "CounterTop", "creditcard": "CreditCard", "cellphone": "CellPhone",
    "desklamp": "DeskLamp", "dishsponge": "DishSponge", "diningtable": "DiningTable",
    "garbagecan": "GarbageCan", "handtowel": "HandTowel", "handtowelholder": "HandTowelHolder",
    "keychain": "KeyChain", "peppershaker": "PepperShaker", "remotecontrol": "RemoteControl",
    "saltshaker": "SaltShaker", "sidetable": "SideTable", "sinkbasin": "SinkBasin",
    "soapbar": "SoapBar", "soapbottle": "SoapBottle", "spraybottle": "SprayBottle",
    "stoveburner": "StoveBurner", "tissuebox": "TissueBox", "toiletpaper": "ToiletPaper",
    "toiletpaperhanger": "ToiletPaperHanger", "towelholder": "TowelHolder", "winebottle": "WineBottle",
}


def pddl_type(kind: str) -> str:
    """ALFRED's type constant for a kind, e.g. ``sinkbasin`` -> ``SinkBasinType``."""
    return PDDL_TYPE_NAMES.get(kind, kind.capitalize()) + "Type"


@dataclass(frozen=True)
class RoomKind:
    """A kind of room: the receptacles it may have (kind -> (min, max) count) and its objects."""

    name: str
    receptacles: tuple[tuple[str, int, int], ...]
    objects: frozenset[str]


ROOM_KINDS: dict[str, RoomKind] = {
    "kitchen": RoomKind(
        "kitchen",
        (("cabinet", 3, 12), ("drawer", 1, 8), ("countertop", 1, 3), ("fridge", 1, 1),
         ("microwave", 1, 1), ("sinkbasin", 1, 2), ("stoveburner", 2, 4), ("garbagecan", 1, 1),
         ("diningtable", 0, 1), ("shelf", 0, 3), ("coffeemachine", 1, 1), ("toaster", 0, 1)),
        FOOD | DISH | COOKWARE | UTENSIL | KITCHEN_MISC | {"cellphone", "creditcard"},
    ),
    "livingroom": RoomKind(
        "livingroom",
        (("sofa", 1, 1), ("armchair", 0, 2), ("coffeetable", 1, 2), ("sidetable", 0, 2),
         ("diningtable", 0, 1), ("drawer", 0, 6), ("cabinet", 0, 4), ("shelf", 0, 6),
         ("dresser", 0, 1), ("garbagecan", 1, 1), ("safe", 0, 1)),
        OFFICE | DECOR | {"pillow"},
    ),
    "bedroom": RoomKind(
        "bedroom",
        (("bed", 1, 1), ("desk", 0, 1), ("sidetable", 1, 2), ("dresser", 0, 1), ("drawer", 2, 8),
         ("shelf", 0, 4), ("garbagecan", 1, 1), ("safe", 0, 1), ("armchair", 0, 1)),
        OFFICE | DECOR | {"pillow", "mug", "cup", "bowl"},
    ),
    "bathroom": RoomKind(
        "bathroom",
        (("toilet", 1, 1), ("sinkbasin", 1, 2), ("bathtubbasin", 0, 1), ("cabinet", 1, 4),
         ("countertop", 1, 1), ("drawer", 0, 4), ("towelholder", 1, 1), ("handtowelholder", 0, 1),
         ("toiletpaperhanger", 1, 1), ("garbagecan", 1, 1), ("shelf", 0, 2), ("dresser", 0, 1)),
        BATH,
    ),
}
